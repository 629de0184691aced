"""karpflow's own disruption settings on a NodePool, for running beside Karpenter's provisioner.

Karpenter cannot switch its disruption off except through the NodePool fields karpflow also reads
(budgets of "0", `expireAfter: Never`, no interruption queue). When both run, the NodePool says
"Karpenter: do nothing" in its spec, and says what karpflow should do in annotations that take
precedence for karpflow only:

    karpflow.dev/consolidation-policy: WhenEmptyOrUnderutilized   # or WhenEmpty, Balanced
    karpflow.dev/consolidate-after: 30s                          # or Never
    karpflow.dev/budgets: '[{"nodes": "10%"}, {"nodes": "0", "schedule": "0 9 * * 1-5", "duration": "8h"}]'
    karpflow.dev/expire-after: 720h                              # or Never
    karpflow.dev/termination-grace-period: 48h
    karpflow.dev/max-disruptions-per-hour: "2"                   # a rate budget: 2 per hour
    karpflow.dev/consolidation-strategy: Optimal                 # or Karpenter (the default)
    karpflow.dev/min-savings-per-hour: "0.05"                    # $/h a replace must save
    karpflow.dev/min-savings-fraction: "10%"                     # or 0.1: of what the nodes cost
    karpflow.dev/require-approval: "true"                        # or "Drifted,Underutilized"
    karpflow.dev/approval-timeout: 4h                            # no decision within it rejects (24h)

The values have the shape of the spec fields they replace (budgets as JSON, where a budget may carry
karpflow's `per`: a field Karpenter's NodePool CRD would prune from the spec). The template is not
touched, so the drift hashes Karpenter stamped stay valid. A value that does not parse (or a
negative duration) is reported and makes the pool fail closed, like an invalid budget: karpflow does
not disrupt it voluntarily until it is fixed, and the setting itself reads as the value that drives
nothing: an invalid consolidate-after or expire-after as Never, an invalid termination-grace-period
as no deadline (never Karpenter's value instead, which beside Karpenter is not karpflow's intent).

`approval-timeout` must be a duration longer than 0s ("Never" is refused: a waiting command must
end); one that does not parse fails the pool closed like the others (and reads as the default, 24h).

The savings floor (`min-savings-*`, planner/savings_threshold.py) fails closed more narrowly: a bad
value is reported and stops replace-consolidation of the pool (deletes, drift and expiration go on).
`consolidation-strategy: Optimal` adds the target-fleet consolidation of planner/optimal/ before
Karpenter's multi- and single-node methods (docs/optimal-consolidation.md).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ValidationError

from api.duration import NEVER, karpenter_duration
from api.rollout_policy import ROLLOUT_POLICY_ANNOTATION, ROLLOUT_STATE_ANNOTATION

if TYPE_CHECKING:
    from api.nodepool import NodePool

PREFIX = "karpflow.dev/"
CONSOLIDATION_POLICY = PREFIX + "consolidation-policy"
CONSOLIDATE_AFTER = PREFIX + "consolidate-after"
BUDGETS = PREFIX + "budgets"
EXPIRE_AFTER = PREFIX + "expire-after"
TERMINATION_GRACE_PERIOD = PREFIX + "termination-grace-period"
# "true": a rebalance recommendation replaces the node proactively, within budgets (docs/interruption.md).
REBALANCE_REPLACE = PREFIX + "rebalance-replace"
# "N": at most N of the pool's nodes start a disruption in any hour (a rate budget of N per 1h,
# for every reason; planner/rate_budgets.py).
MAX_DISRUPTIONS_PER_HOUR = PREFIX + "max-disruptions-per-hour"
CONSOLIDATION_STRATEGY = PREFIX + "consolidation-strategy"
# "true" (every voluntary reason) or a comma list of reasons: the pool's voluntary commands wait for
# an operator's `approve` before they take any node (workflows/disruption.py).
REQUIRE_APPROVAL = PREFIX + "require-approval"
# How long such a command waits for a decision before it is rejected (default 24h).
APPROVAL_TIMEOUT = PREFIX + "approval-timeout"
APPROVAL_REASONS = ("Underutilized", "Empty", "Drifted")
MIN_SAVINGS_PER_HOUR = PREFIX + "min-savings-per-hour"
MIN_SAVINGS_FRACTION = PREFIX + "min-savings-fraction"
# Read by read_savings_floor: a bad value stops only replace-consolidation, not the whole pool.
SAVINGS_FLOOR_KEYS = frozenset({MIN_SAVINGS_PER_HOUR, MIN_SAVINGS_FRACTION})

POLICIES = ("WhenEmpty", "WhenEmptyOrUnderutilized", "Balanced")
KARPENTER_STRATEGY = "Karpenter"
OPTIMAL_STRATEGY = "Optimal"
STRATEGIES = (KARPENTER_STRATEGY, OPTIMAL_STRATEGY)


class NodePoolOverrides(BaseModel):
    """The karpflow.dev/* annotations of one NodePool; None where absent. An invalid duration reads
    as "Never" (for termination_grace_period: no deadline); other invalid values as absent."""

    consolidation_policy: Literal["WhenEmpty", "WhenEmptyOrUnderutilized", "Balanced"] | None = None
    consolidate_after: str | None = None
    budgets: list[dict[str, Any]] | None = None
    expire_after: str | None = None
    termination_grace_period: str | None = None
    rebalance_replace: bool | None = None
    max_disruptions_per_hour: int | None = None
    consolidation_strategy: Literal["Karpenter", "Optimal"] | None = None
    require_approval: list[str] | None = None
    approval_timeout: timedelta | None = None

    @property
    def disruption(self) -> dict[str, Any]:
        """The spec.disruption fields these overrides replace, in wire form."""
        fields = {
            "consolidationPolicy": self.consolidation_policy,
            "consolidateAfter": self.consolidate_after,
            "budgets": self.budgets,
        }
        return {key: value for key, value in fields.items() if value is not None}


def _duration(value: str, never_ok: bool) -> str:
    karpenter_duration(value, never_ok=never_ok)  # raises DurationError naming what is wrong
    return value


# What an invalid duration annotation reads as: the value that drives nothing.
_FAIL_CLOSED: dict[str, Any] = {
    "consolidate_after": NEVER,
    "expire_after": NEVER,
    "termination_grace_period": NEVER,
    "require_approval": list(APPROVAL_REASONS),
}
_READ_AS = {
    "consolidate_after": "read as Never: nothing is consolidated",
    "expire_after": "read as Never: nothing expires",
    "termination_grace_period": "read as no deadline: drains wait for PDBs and do-not-disrupt",
    "require_approval": "read as true: every voluntary command waits for approval",
    "approval_timeout": "read as the default, 24h",
}


def _budgets(value: str) -> list[dict[str, Any]]:
    from api.nodepool import Budget  # api.nodepool imports this module

    try:
        budgets = json.loads(value)
    except json.JSONDecodeError as err:
        raise ValueError(f"not JSON: {err.msg} at character {err.pos}") from None
    if not isinstance(budgets, list) or not all(isinstance(b, dict) for b in budgets):
        raise ValueError('expected a JSON list of budgets, e.g. [{"nodes": "10%"}]')
    for index, budget in enumerate(budgets):
        try:
            Budget.model_validate(budget)
        except ValidationError as err:
            message = "; ".join(e["msg"].removeprefix("Value error, ") for e in err.errors())
            raise ValueError(f"budget {index}: {message}") from None
    return budgets


def _policy(value: str) -> str:
    if value not in POLICIES:
        raise ValueError(f"expected one of {', '.join(POLICIES)}")
    return value


def _count(value: str) -> int:
    if not value.isdigit():
        raise ValueError("expected a non-negative integer")
    return int(value)


def _strategy(value: str) -> str:
    if value not in STRATEGIES:
        raise ValueError(f"expected one of {', '.join(STRATEGIES)}")
    return value


def _true_or_false(value: str) -> bool:
    if value not in ("true", "false"):
        raise ValueError('must be "true" or "false"')
    return value == "true"


def _approval_reasons(value: str) -> list[str]:
    if value in ("true", "false"):
        return list(APPROVAL_REASONS) if value == "true" else []
    reasons = [r.strip() for r in value.split(",") if r.strip()]
    unknown = [r for r in reasons if r not in APPROVAL_REASONS]
    if unknown or not reasons:
        raise ValueError(f'expected "true", "false" or reasons among {", ".join(APPROVAL_REASONS)}')
    return reasons


def _approval_timeout(value: str) -> timedelta:
    timeout = karpenter_duration(value, never_ok=False)  # raises DurationError naming what is wrong
    if timeout is None or timeout <= timedelta(0):
        raise ValueError("must be longer than 0s: a command waits at most this long for a decision")
    return timeout


_PARSERS = {
    CONSOLIDATION_POLICY: ("consolidation_policy", _policy),
    CONSOLIDATE_AFTER: ("consolidate_after", lambda v: _duration(v, never_ok=True)),
    BUDGETS: ("budgets", _budgets),
    EXPIRE_AFTER: ("expire_after", lambda v: _duration(v, never_ok=True)),
    TERMINATION_GRACE_PERIOD: ("termination_grace_period", lambda v: _duration(v, never_ok=False)),
    REBALANCE_REPLACE: ("rebalance_replace", _true_or_false),
    MAX_DISRUPTIONS_PER_HOUR: ("max_disruptions_per_hour", _count),
    CONSOLIDATION_STRATEGY: ("consolidation_strategy", _strategy),
    REQUIRE_APPROVAL: ("require_approval", _approval_reasons),
    APPROVAL_TIMEOUT: ("approval_timeout", _approval_timeout),
}


# The rollout policy (the operator's) and state (the RolloutWorkflow's): api/rollout_policy.py.
ROLLOUT_KEYS = frozenset({ROLLOUT_POLICY_ANNOTATION, ROLLOUT_STATE_ANNOTATION})


def read_overrides(annotations: Mapping[str, str]) -> tuple[NodePoolOverrides, list[str]]:
    """The overrides in a NodePool's annotations, and one problem per annotation that does not parse."""
    values: dict[str, Any] = {}
    problems: list[str] = []
    for key, raw in annotations.items():
        if not key.startswith(PREFIX):
            continue
        if key in SAVINGS_FLOOR_KEYS:
            continue  # read_savings_floor
        if key in ROLLOUT_KEYS:
            continue  # planner/rollout_holds.py reads (and reports) them
        if key not in _PARSERS:
            known = sorted({*_PARSERS, *SAVINGS_FLOOR_KEYS, *ROLLOUT_KEYS})
            problems.append(f"annotation {key}: unknown (known: {', '.join(known)})")
            continue
        field, parse = _PARSERS[key]
        try:
            values[field] = parse(str(raw).strip())
        except ValueError as err:
            read_as = f" ({_READ_AS[field]})" if field in _READ_AS else ""
            problems.append(f"annotation {key}={raw!r}: {err}{read_as}")
            if field in _FAIL_CLOSED:
                values[field] = _FAIL_CLOSED[field]
    return NodePoolOverrides(**values), problems


def overrides_of(pool: NodePool) -> NodePoolOverrides:
    """The karpflow.dev/* annotations of a NodePool model, parsed once per distinct set."""
    own = tuple(sorted((k, v) for k, v in pool.metadata.annotations.items() if k.startswith(PREFIX)))
    return _parsed(own)


@functools.lru_cache(maxsize=256)
def _parsed(annotations: tuple[tuple[str, str], ...]) -> NodePoolOverrides:
    return read_overrides(dict(annotations))[0]


def apply_disruption_overrides(raw: Mapping[str, Any]) -> tuple[Mapping[str, Any], list[str]]:
    """A raw NodePool whose spec.disruption carries karpflow's values, and the annotation problems."""
    annotations = (raw.get("metadata") or {}).get("annotations") or {}
    if not isinstance(annotations, Mapping) or not any(str(k).startswith(PREFIX) for k in annotations):
        return raw, []
    overrides, problems = read_overrides(annotations)
    if not overrides.disruption:
        return raw, problems
    spec = raw.get("spec")
    if not isinstance(spec, Mapping):
        spec = {}
    disruption = spec.get("disruption")
    if not isinstance(disruption, Mapping):
        disruption = {}
    return {**raw, "spec": {**spec, "disruption": {**disruption, **overrides.disruption}}}, problems


class SavingsFloor(BaseModel):
    """What a replace-consolidation must save to be worth its disruption (None: no floor of that kind).
    `fraction` is of what the replaced nodes cost now."""

    per_hour: float | None = None
    fraction: float | None = None


def _money(value: str) -> float:
    try:
        amount = float(value.removeprefix("$"))
    except ValueError:
        raise ValueError("expected dollars per hour, e.g. 0.05") from None
    if not amount >= 0 or amount == float("inf"):  # also refuses NaN
        raise ValueError("must be a finite amount >= 0")
    return amount


def _fraction(value: str) -> float:
    text = value.removesuffix("%")
    try:
        share = float(text) / (100 if text != value else 1)
    except ValueError:
        raise ValueError('expected a fraction such as 0.1 or a percentage such as "10%"') from None
    if not 0 <= share <= 1:  # also refuses NaN
        raise ValueError("must lie between 0 and 1 (0 % and 100 %)")
    return share


def read_savings_floor(annotations: Mapping[str, str]) -> tuple[SavingsFloor, list[str]]:
    """The savings floor in a NodePool's annotations, and one problem per value that does not parse."""
    values: dict[str, float] = {}
    problems: list[str] = []
    for key, field, parse in (
        (MIN_SAVINGS_PER_HOUR, "per_hour", _money),
        (MIN_SAVINGS_FRACTION, "fraction", _fraction),
    ):
        if key not in annotations:
            continue
        raw = annotations[key]
        try:
            values[field] = parse(str(raw).strip())
        except ValueError as err:
            problems.append(f"annotation {key}={raw!r}: {err}")
    return SavingsFloor(**values), problems
