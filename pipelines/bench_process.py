"""What a benchmark's processes use: resident memory and CPU seconds of a process and all its descendants, read
from /proc (the extraction workers and Dagster's step processes count too)."""

from __future__ import annotations

import os
import threading
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


class TreeRss:
    """Peak resident memory of this process and all its descendants (summed), and the CPU seconds they used,
    sampled from /proc."""

    def __init__(self, every: float = 0.25):
        self.every, self.peak = every, 0
        self._cpu: dict[int, float] = {}  # descendant pid -> its CPU seconds when last seen
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lazyhippo-rss", daemon=True)

    @staticmethod
    def _tree(root: int) -> tuple[int, dict[int, float]]:
        """The tree's resident bytes, and the CPU seconds of each descendant."""
        page, tick = os.sysconf("SC_PAGE_SIZE"), os.sysconf("SC_CLK_TCK")
        procs = process_tree(root)
        return (sum(int(p["statm"][1]) * page for p in procs.values()),
                {pid: (int(p["stat"][11]) + int(p["stat"][12])) / tick for pid, p in procs.items() if pid != root})

    def _sample(self) -> None:
        rss, cpu = self._tree(os.getpid())
        self.peak = max(self.peak, rss)
        for pid, seconds in cpu.items():
            self._cpu[pid] = max(self._cpu.get(pid, 0.0), seconds)

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
