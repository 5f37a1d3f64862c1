"""PDF text extraction in a child process with CPU-time and memory limits and a cap on the extracted text.

A few kilobytes of PDF can cost minutes of CPU and hundreds of megabytes (pages sharing one huge content
stream); the parser runs where the kernel can stop it, and any limit it hits is that file's error. One child
serves the PDFs of a process one after another (starting one per PDF cost 0.6 s each); before each file it sets
its CPU limit to what it used so far plus the budget, so every file gets the whole budget. A child stopped by a
limit is replaced at the next PDF. Text files never start one.

Many small PDFs each within the per-file budget could still cost minutes together: a read of a whole source
(`cpu_budget`, taken by `read_source` and the source scan of an index run or upload) has a total, and each file
gets at most what is left of it; once it is spent, the remaining PDFs are that source's errors, unparsed.
"""

from __future__ import annotations

import contextvars
import json
import os
import resource
import select
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Iterator


@dataclass(frozen=True)
class ParseLimits:
    cpu_seconds: int = 60
    memory_bytes: int = 1 << 30
    max_chars: int = 5_000_000   # extracted text per file
    total_cpu_seconds: int = 600  # every PDF of one source read (an index run, an upload) together


PARSE_LIMITS = ParseLimits()


@dataclass
class CpuBudget:
    total: int
    spent: float = 0.0


_BUDGET: contextvars.ContextVar[CpuBudget | None] = contextvars.ContextVar("lazyhippo_pdf_budget", default=None)


@contextmanager
def cpu_budget(limits: ParseLimits = PARSE_LIMITS) -> Iterator[CpuBudget]:
    """The PDFs parsed inside share `limits.total_cpu_seconds` of CPU (an enclosing budget stays in force)."""
    outer = _BUDGET.get()
    token = _BUDGET.set(outer or CpuBudget(limits.total_cpu_seconds))
    try:
        yield _BUDGET.get()
    finally:
        _BUDGET.reset(token)
_OVER_MEMORY = 3  # the child's exit code when the memory limit stopped it


class _Child:
    """The parsing process of this process (a forked process starts its own), with the memory limit it got."""

    lock = threading.Lock()
    proc: subprocess.Popen | None = None
    owner = 0
    memory = 0

    @classmethod
    def ask(cls, path: Path, limits: ParseLimits) -> dict:
        with cls.lock:
            if cls.proc is None or cls.proc.poll() is not None or cls.owner != os.getpid() or cls.memory != limits.memory_bytes:
                cls._start(limits.memory_bytes)
            proc = cls.proc
            proc.stdin.write(json.dumps({"path": str(path), **asdict(limits)}).encode() + b"\n")
            proc.stdin.flush()
            wall = limits.cpu_seconds * 3 + 30  # only catches a child that sleeps or waits; CPU has its own limit
            ready, _, _ = select.select([proc.stdout], [], [], wall)
            line = proc.stdout.readline() if ready else b""
            if line:
                return json.loads(line)
            if not ready:
                proc.kill()
            code = proc.wait()
            cls.proc = None
        if not ready:
            raise ValueError(f"PDF parsing took longer than {wall} s: stopped")
        if code in (-signal.SIGXCPU, -signal.SIGKILL):
            raise ValueError(f"PDF parsing over the CPU limit ({limits.cpu_seconds} s): stopped")
        if code == _OVER_MEMORY:
            raise ValueError(f"PDF parsing over the memory limit ({limits.memory_bytes >> 20} MB): stopped")
        raise ValueError(f"PDF parser exited with code {code}")

    @classmethod
    def _start(cls, memory: int) -> None:
        if cls.proc is not None and cls.owner == os.getpid():
            cls.proc.kill()
            cls.proc.wait()
        cls.proc = subprocess.Popen([sys.executable, "-m", "lazyhippo.sources.pdf", str(memory)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        cls.owner, cls.memory = os.getpid(), memory


def read_pdf(path: Path, limits: ParseLimits = PARSE_LIMITS) -> tuple[str | None, list[tuple[str, int]]]:
    """(title, [(page text, page number)]); a ValueError naming the limit or the parser's failure otherwise.
    Inside `cpu_budget`, the file gets at most what is left of the total."""
    budget = _BUDGET.get()
    if budget is not None:
        left = budget.total - budget.spent
        if left < 1:
            raise ValueError(f"not parsed: the PDFs of this source used up their CPU budget ({budget.total} s)")
        limits = replace(limits, cpu_seconds=min(limits.cpu_seconds, int(left)))
    try:
        out = _Child.ask(path, limits)
    except ValueError:
        if budget is not None:
            budget.spent += limits.cpu_seconds  # stopped by a limit: count it whole
        raise
    if budget is not None:
        budget.spent += out.get("cpu", 0.0)
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


def serve(memory: int) -> int:
    """The child: one request per line on stdin ({"path", "cpu_seconds", "max_chars", ...}), one reply per line."""
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever the parser prints cannot break the replies
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    for line in sys.stdin.buffer:
        request = json.loads(line)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        used = usage.ru_utime + usage.ru_stime
        budget = int(used) + 1 + request["cpu_seconds"]
        resource.setrlimit(resource.RLIMIT_CPU, (budget, hard))  # SIGXCPU ends the child there
        try:
            out = _extract(request["path"], request["max_chars"])
        except MemoryError:
            return _OVER_MEMORY
        usage = resource.getrusage(resource.RUSAGE_SELF)
        out["cpu"] = usage.ru_utime + usage.ru_stime - used
        replies.write(json.dumps(out) + "\n")
        replies.flush()
    return 0


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
