"""The typed pieces of a benchmark result, shared by ``run.py`` and ``report.py``.

A result file ``benchmarks/results/<target>.json`` is one :class:`Result`: the target's name and title, its
summary :class:`Row` s (one measured figure each, with the goal it is held to), the target's own measurements
under ``data`` (read back only by the same target's ``render``), and how the run went under ``run``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Row:
    """One measured figure: ``value`` (None when it could not be measured), its goal and whether it met it.

    ``passed`` is None for figures reported without a goal.
    """

    metric: str
    value: float | int | None
    goal: str | None = None
    passed: bool | None = None
    note: str | None = None

    @classmethod
    def at_most(cls, metric: str, value: float | None, bound: float, note: str | None = None, *, shown=None) -> Row:
        """A figure that must not exceed ``bound`` (``shown`` is how the goal reads, default ``≤ bound``)."""
        passed = None if value is None else value <= bound
        return cls(metric, value, shown or f"≤ {bound:g}", passed, note)

    @classmethod
    def at_least(cls, metric: str, value: float | None, bound: float, note: str | None = None, *, shown=None) -> Row:
        """A figure that must reach ``bound``."""
        passed = None if value is None else value >= bound
        return cls(metric, value, shown or f"≥ {bound:g}", passed, note)

    @property
    def status(self) -> str:
        return "" if self.passed is None else ("PASS" if self.passed else "MISS")

    def line(self) -> str:
        """The row as one console line."""
        v = f"{self.value:.4g}" if isinstance(self.value, float) else str(self.value)
        goal = f"  (goal {self.goal})" if self.goal else ""
        note = f"  [{self.note}]" if self.note else ""
        return f"   {self.status:4}  {self.metric}: {v}{goal}{note}"

    def to_json(self) -> dict:
        return {"metric": self.metric, "value": self.value, "goal": self.goal, "pass": self.passed, "note": self.note}

    @classmethod
    def from_json(cls, d: dict) -> Row:
        return cls(d["metric"], d["value"], d.get("goal"), d.get("pass"), d.get("note"))


@dataclass
class Result:
    """Everything one target measured in one run."""

    target: str
    title: str
    rows: list[Row]
    data: dict = field(default_factory=dict)
    run: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "target": self.target,
            "title": self.title,
            "rows": [r.to_json() for r in self.rows],
            "data": self.data,
            "run": self.run,
        }

    @classmethod
    def from_json(cls, d: dict) -> Result:
        return cls(d["target"], d["title"], [Row.from_json(r) for r in d["rows"]], d.get("data", {}), d.get("run", {}))
