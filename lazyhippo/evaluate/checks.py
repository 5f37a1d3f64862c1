"""The outcome of a check, shared by the graph audit and the benchmark checks (plain data, no Dagster)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    description: str
    figures: dict = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)   # ids of what failed (at most a few, all for chunks)
    details: list[dict] = field(default_factory=list)   # one row per probe (question, score, ...)

    def __str__(self) -> str:
        state = "PASS" if self.passed else "FAIL"
        return f"[{state}] {self.name}: {self.description} {self.figures}" + (f" e.g. {self.examples[:5]}" if self.examples else "")
