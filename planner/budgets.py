"""NodePool disruption budgets (behaviour notes §1.5).

- A budget allows `nodes` disruptions at once: an integer, or a percentage of the pool's nodes
  rounded up. It applies to the reasons it lists (all reasons when it lists none).
- A budget with a `schedule` (5-field cron or @macro, UTC) is active only while the most recent cron
  hit lies within `duration` of now; an inactive budget imposes no limit.
- Allowed for a reason = the minimum over the active budgets that apply to it (no budget: 10%).
- Counting: total = the pool's initialized nodes (NodeClaims already InstanceTerminating excluded);
  disrupting = those NotReady, being deleted, tainted `karpenter.sh/disrupted` or v1beta1's
  `karpenter.sh/disruption=disrupting` (already in flight when the pass starts), plus those marked for
  deletion earlier in this pass. Remaining = max(allowed -
  disrupting, 0).
- A budget that fails to parse (bad nodes, bad cron, bad duration) fails closed: 0 for every reason
  of that pool, and the error is reported. Budgets never gate expiration.
- A budget with `per` is a rate, not a concurrency limit (planner/rate_budgets.py); the remaining
  count is the smaller of the two.
"""

from __future__ import annotations

import functools
import math
from datetime import UTC, datetime, timedelta

from croniter import croniter

from api.constants import BUDGET_REASONS
from api.duration import DurationError, karpenter_duration
from api.nodepool import Budget, NodePool
from kube import disruption
from planner.model import BudgetMap, PlanContext
from planner.rate_budgets import rate_limit
from planner.snapshot import Node

UNLIMITED = 2**31 - 1  # Karpenter's MaxInt32 for "no active budget limits this reason"

# robfig/cron (used by Karpenter) macros that croniter spells differently or not at all.
_MACROS = {"@midnight": "0 0 * * *", "@annually": "0 0 1 1 *"}


class BudgetError(ValueError):
    pass


def _cron(schedule: str) -> str:
    text = schedule.strip()
    text = _MACROS.get(text, text)
    if text.startswith("@"):
        if text not in ("@yearly", "@monthly", "@weekly", "@daily", "@hourly"):
            raise BudgetError(f"schedule {schedule!r}: unknown macro")
    elif len(text.split()) != 5:
        raise BudgetError(f"schedule {schedule!r}: expected 5 cron fields (minute hour day month weekday)")
    if not croniter.is_valid(text):
        raise BudgetError(f"schedule {schedule!r}: not a valid cron expression")
    return text


def _duration(budget: Budget) -> timedelta:
    """The budget's window (a model built without validation may still hold a bad one)."""
    try:
        return karpenter_duration(budget.duration or "", never_ok=False) or timedelta(0)
    except DurationError as err:
        raise BudgetError(f"duration {budget.duration!r}: {err}") from None


def budget_active(budget: Budget, now: datetime) -> bool:
    """Whether the budget applies at `now` (UTC): always without a schedule; otherwise when a cron hit
    happened in (now - duration, now]. Raises BudgetError for an unparseable schedule or duration."""
    if budget.schedule is None:
        return True
    duration = _duration(budget)
    cron = _cron(budget.schedule)
    now = utc(now)  # croniter reads the schedule in now's own offset; Karpenter's are UTC
    start = now - duration
    next_hit = croniter(cron, start).get_next(datetime)
    return next_hit <= now


def utc(when: datetime) -> datetime:
    """The same instant in UTC (a naive time is taken as UTC)."""
    return when.astimezone(UTC) if when.tzinfo else when.replace(tzinfo=UTC)


def budget_nodes(budget: Budget, total: int) -> int:
    text = budget.nodes
    if text.endswith("%"):
        return math.ceil(int(text[:-1]) * total / 100)
    return int(text)


def allowed_disruptions(pool: NodePool, total: int, now: datetime, reason: str) -> int:
    """Disruptions the pool's budgets allow for `reason` at `now` (before subtracting in-flight ones).
    Raises BudgetError when a budget cannot be evaluated."""
    allowed = UNLIMITED
    for budget in pool.spec.disruption.budgets:
        if budget.reasons is not None and reason not in budget.reasons:
            continue
        if budget.per is not None:
            continue  # a rate, not a concurrency limit: planner/rate_budgets.py
        if budget_active(budget, now):
            allowed = min(allowed, budget_nodes(budget, total))
    return allowed


def next_budget_change(
    pool: NodePool, now: datetime, horizon: timedelta = timedelta(days=8)
) -> datetime | None:
    """The next time a scheduled budget of the pool starts or stops applying (for people and timers)."""
    changes = []
    now = utc(now)
    for budget in pool.spec.disruption.budgets:
        if budget.schedule is None:
            continue
        try:
            duration = _duration(budget)
            cron = _cron(budget.schedule)
        except BudgetError:
            continue
        hit = croniter(cron, now).get_next(datetime)
        if hit - now <= horizon:
            changes.append(hit)
        if budget_active(budget, now):
            last = croniter(cron, now + timedelta(seconds=1)).get_prev(datetime)
            changes.append(last + duration)
    return min(changes) if changes else None


def counts_toward_budgets(node: Node) -> bool:
    """Whether budgets count the node at all: initialized, its NodeClaim not InstanceTerminating."""
    return node.initialized and not (node.nodeclaim is not None and node.nodeclaim.instance_terminating)


def is_disrupting(node: Node) -> bool:
    """Whether a counted node already consumes its pool's budget: NotReady, being deleted, or held
    by a command (either controller's disruption taint, which in-flight workflows' nodes carry
    virtually). The one rule (kube/disruption.py): the planner's methods and the interruption
    poller's rebalance check (planner/interruption.py) read budgets through `build_budget_map`, and
    NodeDisruptionBudget claims (activities/budget_claims.py) read the same rule."""
    return disruption.is_disrupting(node)


def pool_counts(ctx: PlanContext) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """Per NodePool: the nodes budgets count, those already disrupting when the pass started, and
    those this pass has marked for deletion since (`ctx.marked_for_deletion`, not already counted)."""
    total: dict[str, int] = dict.fromkeys(ctx.snapshot.nodepools, 0)
    in_flight: dict[str, int] = dict.fromkeys(ctx.snapshot.nodepools, 0)
    planned: dict[str, int] = dict.fromkeys(ctx.snapshot.nodepools, 0)
    for name, pool, disrupting in _counted_nodes(ctx):
        total[pool] += 1
        if disrupting:
            in_flight[pool] += 1
        elif name in ctx.marked_for_deletion:
            planned[pool] += 1
    return total, in_flight, planned


def _counted_nodes(ctx: PlanContext) -> list[tuple[str, str, bool]]:
    """(node, pool, disrupting) of every node budgets count: fixed for the pass's snapshot, read by
    every budget map of the pass (a few per method), so worked out once (`ctx.memo`)."""
    counted = ctx.memo.get(_COUNTED_NODES)
    if counted is None:
        counted = ctx.memo[_COUNTED_NODES] = [
            (node.name, pool, is_disrupting(node))
            for node in ctx.snapshot.nodes.values()
            if (pool := node.nodepool) in ctx.snapshot.nodepools and counts_toward_budgets(node)
        ]
    return counted


_COUNTED_NODES = "budgets.counted_nodes"


def build_budget_map(ctx: PlanContext, reason: str) -> BudgetMap:
    """Remaining disruptions per NodePool for `reason` right now."""
    if reason not in BUDGET_REASONS:
        raise ValueError(f"budgets only apply to {', '.join(BUDGET_REASONS)}, not {reason!r}")
    total, in_flight, planned = pool_counts(ctx)
    disrupting = {pool: in_flight[pool] + planned[pool] for pool in total}
    budget_map = BudgetMap(
        reason=reason, remaining={}, total=total, disrupting=disrupting, planned=planned, errors={}
    )
    for name, pool in ctx.snapshot.nodepools.items():
        errors = list(ctx.snapshot.budget_errors.get(name, ()))
        allowed = 0
        if not errors:
            try:
                allowed = allowed_disruptions(pool, total[name], ctx.now, reason)
            except BudgetError as err:
                errors.append(str(err))
        rate = None
        if not errors:
            try:
                rate = rate_limit(
                    pool, total[name], reason, ctx.now, ctx.snapshot.recent_disruptions, _planned(ctx, name)
                )
            except ValueError as err:
                errors.append(f"rate budget: {err}")
        if errors:
            budget_map.errors[name] = errors
            allowed = 0
        # A limit above the pool's size means "unlimited"; report the pool size instead of MaxInt32.
        allowed = min(allowed, total[name])
        budget_map.allowed[name] = allowed
        budget_map.remaining[name] = max(allowed - disrupting[name], 0)
        if rate is not None and rate.remaining < budget_map.remaining[name]:
            budget_map.remaining[name] = rate.remaining
            budget_map.rate_limited[name] = functools.partial(rate.message, name, reason)
    return budget_map


def _planned(ctx: PlanContext, pool: str) -> list[str]:
    """The nodes of `pool` this pass has decided to disrupt so far (rate budgets count them)."""
    return [
        name
        for name in ctx.marked_for_deletion
        if (node := ctx.snapshot.nodes.get(name)) is not None and node.nodepool == pool
    ]


def budget_report(ctx: PlanContext) -> dict[str, dict[str, int]]:
    """pool -> reason -> disruptions still allowed, counting the nodes this pass has marked so far
    (`karpflow plan` calls it before the first command and after the last)."""
    maps = {reason: build_budget_map(ctx, reason) for reason in BUDGET_REASONS}
    return {
        pool: {reason: maps[reason].remaining[pool] for reason in BUDGET_REASONS}
        for pool in sorted(ctx.snapshot.nodepools)
    }


def budget_problems(ctx: PlanContext) -> dict[str, list[str]]:
    """pool -> budgets that fail when evaluated (bad cron or duration), for reporting. Budgets that
    failed to load are already among the snapshot's problems."""
    out: dict[str, list[str]] = {}
    for name, pool in ctx.snapshot.nodepools.items():
        for index, budget in enumerate(pool.spec.disruption.budgets):
            try:
                budget_active(budget, ctx.now)
            except BudgetError as err:
                out.setdefault(name, []).append(f"spec.disruption.budgets[{index}]: {err}")
    return out
