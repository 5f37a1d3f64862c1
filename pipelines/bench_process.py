"""What a benchmark's processes use: resident memory and CPU seconds of a process and all its descendants, read
from /proc (the extraction workers and Dagster's step processes count too)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path


def process_tree(root: int) -> dict[int, dict[str, list[str]]]:
    """`root` and every descendant, from /proc: per process id its `stat` fields after the command name (state
    first) and its `statm` fields."""
    procs: dict[int, dict[str, list[str]]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            statm = Path(f"/proc/{d}/statm").read_text().split()
        except OSError:
            continue
        procs[int(d)] = {"stat": stat, "statm": statm}
    tree, frontier = {root}, {root}
    while frontier:
        frontier = {p for p, v in procs.items() if int(v["stat"][1]) in frontier and p not in tree}
        tree |= frontier
    return {p: procs[p] for p in tree if p in procs}


def _role(pid: int, root: int, parent_role: str | None) -> str:
    """What a process of the tree is, for the per-process figures: the benchmark's own process, a process
    started by multiprocessing's forkserver (the extraction workers), or a child named by its script or module."""
    if pid == root:
        return "run process"
    if parent_role == "forkserver":
        return "forkserver's children (extraction workers)"
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "child"
    words = [w.decode(errors="replace") for w in cmd if w]
    if any("multiprocessing.forkserver" in w for w in words):
        return "forkserver"
    if "-c" in words:  # python -c "from multiprocessing.resource_tracker import main; ..."
        code = words[words.index("-c") + 1]
        return code.split(" import ")[0].removeprefix("from ").strip()[:40]
    script = next((w for w in words[1:] if not w.startswith("-")), words[0] if words else "child")
    return Path(script).name[:40]


class TreeRss:
    """Peak resident memory of this process and all its descendants (summed), and the CPU seconds they used,
    sampled from /proc. Also kept: each process's own peak, the tree's make-up at its peak, and a timeline of
    (seconds since start, tree bytes, this process's bytes) to tell which stage set a peak."""

    def __init__(self, every: float = 0.25):
        self.every, self.peak = every, 0
        self.peak_parts: dict[int, int] = {}  # pid -> its resident bytes when the tree peaked
        self.process_peaks: dict[int, int] = {}  # pid -> its own peak resident bytes
        self.roles: dict[int, str] = {}
        self.timeline: list[tuple[float, int, int]] = []
        self.started = time.time()
        self._cpu: dict[int, float] = {}  # descendant pid -> its CPU seconds when last seen
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lazyhippo-rss", daemon=True)

    def _sample(self) -> None:
        root = os.getpid()
        page, tick = os.sysconf("SC_PAGE_SIZE"), os.sysconf("SC_CLK_TCK")
        procs = process_tree(root)
        rss = {pid: int(p["statm"][1]) * page for pid, p in procs.items()}
        cpu = {pid: (int(p["stat"][11]) + int(p["stat"][12])) / tick for pid, p in procs.items() if pid != root}
        total = sum(rss.values())
        self.timeline.append((time.time() - self.started, total, rss.get(root, 0)))
        if total > self.peak:
            self.peak, self.peak_parts = total, rss
        for pid in sorted(rss, key=lambda p: (p != root, p)):  # a parent (lower id, mostly) named before its children
            if pid not in self.roles:
                self.roles[pid] = _role(pid, root, self.roles.get(int(procs[pid]["stat"][1])))
            self.process_peaks[pid] = max(self.process_peaks.get(pid, 0), rss[pid])
        for pid, seconds in cpu.items():
            self._cpu[pid] = max(self._cpu.get(pid, 0.0), seconds)

    def by_role(self) -> dict[str, dict]:
        """Per kind of process: how many there were, the largest one's peak and their sum at the tree's peak (MB)."""
        out: dict[str, dict] = {}
        for pid, peak in self.process_peaks.items():
            r = out.setdefault(self.roles[pid], {"processes": 0, "largest_peak_mb": 0, "at_tree_peak_mb": 0})
            r["processes"] += 1
            r["largest_peak_mb"] = max(r["largest_peak_mb"], round(peak / 1e6))
            r["at_tree_peak_mb"] += round(self.peak_parts.get(pid, 0) / 1e6)
        return out

    def peak_between(self, start: float, end: float) -> tuple[int, int]:
        """The tree's and this process's peak resident bytes between two wall-clock times (`time.time()`); for a
        span shorter than the sampling, the last sample before its end."""
        start, end = start - self.started, end - self.started
        inside = [(t, o) for s, t, o in self.timeline if start <= s <= end]
        inside = inside or [(t, o) for s, t, o in self.timeline if s <= end][-1:]
        return (max((t for t, _ in inside), default=0), max((o for _, o in inside), default=0))

    def cpu_seconds(self) -> float:
        """CPU seconds of this process and of its descendants so far (a child living under `every` may be missed)."""
        self._sample()
        own = os.times()
        return own.user + own.system + sum(self._cpu.values())

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def __enter__(self) -> "TreeRss":
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
