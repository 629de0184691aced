"""The table every bench ends with: each measure, its goal, and what this run found."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Goal:
    measure: str
    goal: str
    now: str
    met: bool | None = None  # None: a figure without a pass/fail reading


def print_goals(title: str, goals: list[Goal]) -> None:
    """Print `goals` as a table (a figure, never an assertion: the machine may be shared)."""
    if not goals:
        return
    rows = [("measure", "goal", "now", ""), *((g.measure, g.goal, g.now, _mark(g.met)) for g in goals)]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    print(f"\n{title}")
    for index, row in enumerate(rows):
        print("  " + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:3])) + f"  {row[3]}")
        if index == 0:
            print("  " + "  ".join("-" * w for w in widths))


def _mark(met: bool | None) -> str:
    return "" if met is None else "met" if met else "NOT MET"
