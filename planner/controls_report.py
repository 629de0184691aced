"""What the operator's controls hold back right now, by what, and until when: the report of
`karpflow windows` (planner/windows_cli.py), computed from a snapshot like a plan (pure).

- Windows: each MaintenanceWindow, whether it blocks now, until when or when it next blocks (in UTC
  and in the window's time zone), and how many managed nodes it matches.
- Blocked: for every managed node, the actions the windows block on it now and until when.
- NodeDisruptionBudgets: selected, unavailable, allowed and remaining.
- NodePool budgets: per pool and reason, how many disruptions may start now (concurrency and rate
  budgets, with the starts the snapshot knows of) and when a scheduled budget next changes.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from api.constants import BUDGET_REASONS
from api.duration import format_duration
from api.maintenance_window import WINDOW_ACTIONS
from kube.times import rfc3339
from planner.budgets import build_budget_map, next_budget_change
from planner.catalog import Catalog
from planner.maintenance_windows import Window, blocked
from planner.model import PlanContext
from planner.node_disruption_budgets import statuses
from planner.snapshot import Snapshot


class _Out(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class WindowOut(_Out):
    name: str
    actions: list[str]
    selector: list[str] = Field(description="requirements as `key operator [values]`; empty: every node")
    schedules: list[str] = Field(description="`cron for duration`; empty: always active")
    mode: str = Field(description="Block: blocks while a schedule is active; Allow: allows only then")
    time_zone: str = Field(description="the zone its cron is read in (IANA)")
    exclusions: list[str] = Field(default_factory=list, description="one-off blocks, `start to end`")
    active: bool = Field(description="blocking its actions now")
    until: str | None = Field(description="when an active window stops blocking (null: not by itself)")
    until_local: str | None = Field(description="`until` in the window's time zone")
    next_start: str | None = Field(description="when an inactive window next blocks")
    next_start_local: str | None = Field(description="`nextStart` in the window's time zone")
    nodes: int = Field(description="managed nodes it matches")
    problems: list[str] = Field(default_factory=list, description="why it fails closed")


class ActionBlock(_Out):
    action: str
    windows: list[str]
    until: str | None = Field(description="when the block ends; null: not by itself (see `ends`)")
    ends: str = Field(description="when the block ends, for people")
    message: str


class NodeBlocks(_Out):
    node: str
    nodepool: str | None
    blocked: list[ActionBlock]


class NdbOut(_Out):
    name: str
    rule: str = Field(description="maxUnavailable N, minAvailable N, or invalid")
    selected: int
    unavailable: list[str]
    allowed: int
    remaining: int
    problems: list[str] = Field(default_factory=list)


class PoolBudgetOut(_Out):
    nodepool: str
    reason: str
    remaining: int
    why: str = Field(default="", description="what limits it when nothing may start")
    next_change: str | None = Field(description="when a scheduled budget of the pool next starts or stops")


class ControlsReport(_Out):
    at: str
    windows: list[WindowOut]
    blocked: list[NodeBlocks]
    node_disruption_budgets: list[NdbOut]
    nodepool_budgets: list[PoolBudgetOut]
    problems: list[str]

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)


def local_time(when: datetime, window: Window) -> str:
    """`when` on the window's wall clock, with its offset and the zone's abbreviation
    (2026-03-10T02:00:00-04:00 EDT)."""
    local = when.astimezone(window.zone)
    return f"{local.isoformat()} {local.tzname()}"


def _window_out(window: Window, now: datetime, nodes: int) -> WindowOut:
    active = window.active_at(now)
    until = window.active_end(now) if active else None
    start = None if active else window.next_start(now)
    return WindowOut(
        name=window.name,
        actions=sorted(window.actions),
        selector=[repr(r) for r in window.selector or ()],
        schedules=[f"{cron} for {format_duration(duration)}" for cron, duration in window.schedules],
        mode=window.mode,
        time_zone=window.zone.key,
        exclusions=[f"{rfc3339(a)} to {rfc3339(b)}" for a, b in window.exclusions],
        active=active,
        until=rfc3339(until) if until else None,
        until_local=local_time(until, window) if until else None,
        next_start=rfc3339(start) if start else None,
        next_start_local=local_time(start, window) if start else None,
        nodes=nodes,
        problems=list(window.problems),
    )


def controls_report(snapshot: Snapshot, catalog: Catalog) -> ControlsReport:
    now = snapshot.now
    managed = list(snapshot.live_managed_nodes())
    windows = sorted(snapshot.maintenance_windows.values(), key=lambda w: w.name)
    blocks = []
    for node, pool in managed:
        found = [b for action in WINDOW_ACTIONS if (b := blocked(windows, action, node.labels, now))]
        if found:
            blocks.append(
                NodeBlocks(
                    node=node.name,
                    nodepool=pool.name,
                    blocked=[
                        ActionBlock(
                            action=b.action,
                            windows=list(b.windows),
                            until=rfc3339(b.until) if b.until else None,
                            ends=b.ends(),
                            message=b.message(),
                        )
                        for b in found
                    ],
                )
            )
    ndbs = [
        NdbOut(
            name=s.ndb.name,
            rule=s.ndb.describe(),
            selected=len(s.selected),
            unavailable=s.unavailable,
            allowed=s.allowed,
            remaining=s.remaining,
            problems=list(s.ndb.problems),
        )
        for s in statuses(snapshot.node_disruption_budgets.values(), snapshot.nodes.values())
    ]
    ctx = PlanContext(snapshot=snapshot, catalog=catalog)
    pools = []
    maps = {reason: build_budget_map(ctx, reason) for reason in BUDGET_REASONS}
    for name in sorted(snapshot.nodepools):
        change = next_budget_change(snapshot.nodepools[name], now)
        for reason, budget_map in maps.items():
            remaining = budget_map.remaining.get(name, 0)
            pools.append(
                PoolBudgetOut(
                    nodepool=name,
                    reason=reason,
                    remaining=remaining,
                    why=budget_map.exhausted_message(name) if remaining == 0 else "",
                    next_change=rfc3339(change) if change else None,
                )
            )
    return ControlsReport(
        at=rfc3339(now),
        windows=[_window_out(w, now, sum(1 for n, _ in managed if w.matches(n.labels))) for w in windows],
        blocked=blocks,
        node_disruption_budgets=ndbs,
        nodepool_budgets=pools,
        problems=[
            p
            for p in snapshot.problems
            if p.startswith(("MaintenanceWindow ", "NodeDisruptionBudget ", "NodePool "))
        ],
    )
