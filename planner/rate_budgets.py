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
  visibility (activities/recent_starts.py: DisruptionWorkflows and TerminationWorkflows by StartTime,
  plus the commands it holds for validation); a snapshot without them (`karpflow plan --snapshot`)
  sees no recent starts.
- Applied in a pass (planner/budgets.py `build_budget_map`), and again where a voluntary command
  takes its nodes (`rate_refusal`, from activities/controls_gate.py): a leaf of the shared control
  rules, like planner/maintenance_windows.py and planner/node_disruption_budgets.py, so the activities
  read the very rule the planner applies.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from api.cron import cron_expression
from api.duration import format_duration, parse_duration
from api.karpflow_overrides import read_overrides
from api.nodepool import Budget, NodePool
from planner.maintenance_windows import schedule_active
from planner.node_disruption_budgets import scaled

HOUR = timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class RecentDisruption:
    """A node whose disruption started at `started_at` (any reason, forceful ones too): what rate
    budgets (`per`) count. Not cluster state: read from Temporal visibility
    (activities/recent_starts.py) and set as `Snapshot.recent_disruptions`."""

    node: str
    nodepool: str
    reason: str
    started_at: datetime


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


def started_within(
    recent: Iterable[RecentDisruption],
    pool: str,
    per: timedelta,
    now: datetime,
    planned: Collection[str] = (),
) -> set[str]:
    """Nodes of `pool` whose disruption started in (now - per, now], and `planned` (nodes of the pool
    decided on since: a pass's earlier commands, or the command taking them now)."""
    since = now - per
    return {d.node for d in recent if d.nodepool == pool and d.started_at > since} | set(planned)


def _active(pool: NodePool, reason: str, now: datetime) -> Iterator[tuple[Budget, timedelta]]:
    """The pool's rate budgets that limit `reason` at `now`, with their period. Raises ValueError for
    one that cannot be evaluated."""
    for budget in rate_budgets(pool):
        if budget.reasons is not None and reason not in budget.reasons:
            continue
        if budget.schedule is not None and not schedule_active(
            cron_expression(budget.schedule), parse_duration(budget.duration or ""), now
        ):
            continue
        yield budget, parse_duration(budget.per or "")


def rate_limit(
    pool: NodePool,
    total: int,
    reason: str,
    now: datetime,
    recent: Iterable[RecentDisruption],
    planned: Collection[str] = (),
) -> RateLimit | None:
    """The tightest active rate budget of the pool for `reason` (None: no rate budget applies), with
    `planned` counted as started. Raises ValueError for a budget that cannot be evaluated (the pool
    then fails closed)."""
    recent = list(recent)
    tightest: RateLimit | None = None
    for budget, per in _active(pool, reason, now):
        allowed = scaled(budget.nodes, total)
        started = len(started_within(recent, pool.name, per, now, planned))
        limit = RateLimit(max(allowed - started, 0), allowed, per, started)
        if tightest is None or limit.remaining < tightest.remaining:
            tightest = limit
    return tightest


def rate_refusal(
    pool: NodePool,
    total: int,
    reason: str,
    now: datetime,
    recent: Iterable[RecentDisruption],
    taking: Collection[str],
) -> str | None:
    """Why starting a disruption of `taking` (nodes of `pool`) now would exceed one of the pool's
    rate budgets for `reason` (None: it fits): the check where a command takes its nodes, on the rule
    of a pass. `recent` must not hold the command's own start. Nodes already counted as started are
    not counted twice. A budget that cannot be evaluated refuses (fails closed)."""
    recent = list(recent)
    try:
        for budget, per in _active(pool, reason, now):
            allowed = scaled(budget.nodes, total)
            before = started_within(recent, pool.name, per, now)
            after = before | set(taking)
            if len(after) > allowed and len(after) > len(before):
                limit = RateLimit(max(allowed - len(before), 0), allowed, per, len(before))
                return limit.message(pool.name, reason, limit.remaining)
    except ValueError as err:
        return f"nodepool {pool.name} rate budget cannot be read ({err}); it fails closed"
    return None


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
