"""Rate budgets: at most `nodes` of a NodePool start a disruption within any `per` (karpflow's
answer to kubernetes-sigs/karpenter #2909, "30 % per 10 minutes"; docs/operator-controls.md).

- A NodePool budget with `per` is a rate, not a concurrency limit: `{nodes: "30%", per: 10m}`. It
  takes `reasons`, `schedule` and `duration` like any budget (a scheduled rate applies while its
  window is active). Budgets without `per` stay what they are in Karpenter: how many may be
  disrupting at once. Both kinds apply together: the smaller allowance wins.
- The annotation `karpflow.dev/max-disruptions-per-hour: "N"` adds `{nodes: "N", per: 1h}` for every
  reason.
- Counted: every node of the pool whose disruption started within the last `per`, whatever its reason
  (expiration, interruption and manual deletions too: forceful work counts, as in concurrency
  budgets), plus the nodes this pass has already decided to disrupt. Percentages are of the pool's
  nodes, rounded up, as for concurrency budgets.
- Where the starts come from: `Snapshot.recent_disruptions`. The controller fills it from Temporal
  visibility (DisruptionWorkflows by KarpflowNodePool and StartTime, plus the commands it holds for
  validation); a snapshot without them (`karpflow plan --snapshot`) sees no recent starts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

from api.cron import cron_expression
from api.duration import format_duration, parse_duration
from api.karpflow_overrides import read_overrides
from api.nodepool import Budget, NodePool
from planner.maintenance_windows import schedule_active
from planner.model import PlanContext
from planner.node_disruption_budgets import scaled

HOUR = timedelta(hours=1)


@dataclass(frozen=True)
class RateLimit:
    """What the tightest active rate budget of a pool leaves for a reason."""

    remaining: int
    allowed: int
    per: timedelta
    started: int

    def message(self, pool: str, reason: str, remaining: int) -> str:
        """Why the pool cannot start more, once the pass has spent the allowance down to `remaining`."""
        started = self.started + self.remaining - remaining
        return (
            f"nodepool {pool} rate budget for {reason} is used up "
            f"({self.allowed} per {format_duration(self.per)}: {started} started in the last "
            f"{format_duration(self.per)}; {remaining} left)"
        )


def rate_budgets(pool: NodePool) -> list[Budget]:
    """The pool's budgets with `per`, and the one its max-disruptions-per-hour annotation adds."""
    budgets = [b for b in pool.spec.disruption.budgets if b.per is not None]
    per_hour = read_overrides(pool.metadata.annotations)[0].max_disruptions_per_hour
    if per_hour is not None:
        budgets.append(Budget(nodes=str(per_hour), per="1h"))
    return budgets


def started_within(ctx: PlanContext, pool: str, per: timedelta) -> int:
    """Nodes of `pool` whose disruption started in (now - per, now], and those this pass disrupts."""
    since = ctx.now - per
    recent = {d.node for d in ctx.snapshot.recent_disruptions if d.nodepool == pool and d.started_at > since}
    planned = {
        name
        for name in ctx.marked_for_deletion
        if (node := ctx.snapshot.nodes.get(name)) is not None and node.nodepool == pool
    }
    return len(recent | planned)


def rate_limit(ctx: PlanContext, pool: NodePool, total: int, reason: str) -> RateLimit | None:
    """The tightest active rate budget of the pool for `reason` (None: no rate budget applies).
    Raises ValueError for a budget that cannot be evaluated (the pool then fails closed)."""
    tightest: RateLimit | None = None
    for budget in rate_budgets(pool):
        if budget.reasons is not None and reason not in budget.reasons:
            continue
        if budget.schedule is not None and not schedule_active(
            cron_expression(budget.schedule), parse_duration(budget.duration or ""), ctx.now
        ):
            continue
        per = parse_duration(budget.per or "")
        allowed = scaled(budget.nodes, total)
        started = started_within(ctx, pool.name, per)
        limit = RateLimit(max(allowed - started, 0), allowed, per, started)
        if tightest is None or limit.remaining < tightest.remaining:
            tightest = limit
    return tightest


def longest_period(pools: Iterable[NodePool]) -> timedelta | None:
    """How far back the starts must be read for these pools' rate budgets (None: no rate budget),
    so the controller asks Temporal visibility for no more than it needs."""
    periods = []
    for pool in pools:
        for budget in rate_budgets(pool):
            try:
                periods.append(parse_duration(budget.per or ""))
            except ValueError:
                continue  # the pool fails closed anyway
    return max(periods) if periods else None
