"""PDF text extraction in a child process with CPU-time and memory limits and a cap on the extracted text.

A few kilobytes of PDF can cost minutes of CPU and hundreds of megabytes (pages sharing one huge content
stream); the parser runs where the kernel can stop it, and any limit it hits is that file's error. One child per
PDF (text files never start one); `python -m lazyhippo.sources.pdf FILE MAX_CHARS CPU_SECONDS MEMORY_BYTES`
prints the title and pages as JSON.
"""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ParseLimits:
    cpu_seconds: int = 60
    memory_bytes: int = 1 << 30
    max_chars: int = 5_000_000   # extracted text per file


PARSE_LIMITS = ParseLimits()
_OVER_MEMORY = 3  # the child's exit code when the memory limit stopped it


def read_pdf(path: Path, limits: ParseLimits = PARSE_LIMITS) -> tuple[str | None, list[tuple[str, int]]]:
    """(title, [(page text, page number)]); a ValueError naming the limit or the parser's failure otherwise."""
    argv = [sys.executable, "-m", "lazyhippo.sources.pdf", str(path), str(limits.max_chars), str(limits.cpu_seconds),
            str(limits.memory_bytes)]
    try:  # the wall-clock bound only catches a child that sleeps or waits; CPU is bounded by its own limit
        done = subprocess.run(argv, capture_output=True, timeout=limits.cpu_seconds * 3 + 30)
    except subprocess.TimeoutExpired:
        raise ValueError(f"PDF parsing took longer than {limits.cpu_seconds * 3 + 30} s: stopped") from None
    if done.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        raise ValueError(f"PDF parsing over the CPU limit ({limits.cpu_seconds} s): stopped")
    if done.returncode == _OVER_MEMORY:
        raise ValueError(f"PDF parsing over the memory limit ({limits.memory_bytes >> 20} MB): stopped")
    try:
        out = json.loads(done.stdout)
    except ValueError:
        raise ValueError(f"PDF parser exited with code {done.returncode}") from None
    if "error" in out:
        raise ValueError(out["error"])
    return out["title"], [tuple(p) for p in out["pages"]]


def _extract(path: str, max_chars: int) -> dict:
    import logging

    from pypdf import PdfReader

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # its repair warnings are noise; the failure is reported
    try:
        reader = PdfReader(path)
        if reader.is_encrypted:
            return {"error": "encrypted PDF"}
        pages, total = [], 0
        for i, page in enumerate(reader.pages):
            text = (page.extract_text() or "").strip()
            total += len(text)
            if total > max_chars:
                return {"error": f"extracted text over {max_chars:,} characters: not indexed"}
            pages.append((text, i + 1))
        title = (reader.metadata or {}).get("/Title") if reader.metadata else None
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - a per-file boundary around a third-party parser
        return {"error": f"unparsable PDF ({exc.__class__.__name__}: {str(exc)[:200]})"}
    return {"title": str(title) if title else None, "pages": pages}


def main(argv: list[str]) -> int:
    path, max_chars, cpu, memory = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at the soft limit, SIGKILL one second on
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    try:
        out = _extract(path, max_chars)
    except MemoryError:
        return _OVER_MEMORY
    sys.stdout.write(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
