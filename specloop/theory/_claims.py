"""`ClaimResult` and the tally that builds it (shared by the theory check modules)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["ClaimResult", "Tally"]


@dataclass(frozen=True)
class ClaimResult:
    """Verdict on one claim. ``counterexample`` is the smallest violating case or None."""

    claim: str
    holds: bool
    cases: int
    violations: int
    worst_ratio: float
    counterexample: dict[str, Any] | None
    statement: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Tally:
    """Accumulates cases, violations, the worst ratio and the smallest counterexample."""

    def __init__(self, lower: bool):
        self.lower, self.cases, self.violations = lower, 0, 0
        self.worst = -math.inf if lower else math.inf
        self.best_key, self.counterexample = None, None
        self.by_family: dict[str, list[int]] = {}  # family -> [cases, violations]

    def add(self, ratio: float, violated: bool, key, example, family: str | None = None) -> None:
        self.cases += 1
        if family is not None:
            counts = self.by_family.setdefault(family, [0, 0])
            counts[0] += 1
            counts[1] += bool(violated)
        self.worst = max(self.worst, ratio) if self.lower else min(self.worst, ratio)
        if violated:
            self.violations += 1
            if self.best_key is None or key < self.best_key:
                self.best_key, self.counterexample = key, example()

    def result(self, claim: str, statement: str, **details) -> ClaimResult:
        if self.by_family:
            details["cases_and_violations_by_family"] = {
                name: {"cases": c, "violations": v} for name, (c, v) in self.by_family.items()}
        return ClaimResult(claim, self.violations == 0, self.cases, self.violations,
                           float(self.worst), self.counterexample, statement, details)
