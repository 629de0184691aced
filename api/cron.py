"""Cron schedules as Karpenter reads them (robfig/cron): five fields or an @macro, always in UTC.

MaintenanceWindow schedules use this; NodePool budget schedules follow the same rules
(planner/budgets.py). The macros are expanded here so that croniter, which spells some of them
differently, never sees one.
"""

from __future__ import annotations

from croniter import croniter

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


def cron_expression(schedule: str) -> str:
    """The five-field expression of `schedule`; ValueError naming what is wrong otherwise."""
    text = " ".join(str(schedule).split())
    if text.startswith("@"):
        if text not in MACROS:
            raise ValueError(f"cron {schedule!r}: unknown macro (known: {', '.join(MACROS)})")
        return MACROS[text]
    if len(text.split()) != 5:
        raise ValueError(f"cron {schedule!r}: expected 5 fields (minute hour day-of-month month day-of-week)")
    if not croniter.is_valid(text):
        raise ValueError(f"cron {schedule!r}: not a valid cron expression")
    return text
