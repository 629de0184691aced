"""How karpflow reads a NodePool from a cluster: every setting that is invalid reads as the value that
disrupts nothing, and is reported (issue 17: a negative expireAfter expired a whole pool, again and
again).

- karpflow.dev/* annotations replace spec.disruption (api/karpflow_overrides.py);
- an invalid expireAfter or consolidateAfter reads as Never, an invalid terminationGracePeriod as
  unset (no drain deadline: PDBs and do-not-disrupt are waited for, never a deadline in the past);
- an invalid budget is dropped;
- an invalid `spec.replicas` (Karpenter v1.8 static pools) reads as 0: the pool is static, so it is
  never consolidated, and StaticDrift waits while it has more nodes than 0 (planner/static_drift.py);
- an invalid `spec.limits` quantity reads as 0: no replacement may launch into the pool;
- each is a problem, and the planner fails the pool closed for voluntary disruption until it is
  fixed, as Karpenter does for an invalid budget.

The planner (planner/snapshot.py) and the termination activity (its drain deadline) read pools here.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from pydantic import ValidationError

from api.duration import NEVER, DurationError, karpenter_duration, parse_optional_duration
from api.karpflow_overrides import apply_disruption_overrides, overrides_of
from api.nodepool import Budget, NodePool, pydantic_message
from api.quantity import QuantityError, millicores, to_int

# The durations read fail closed: (section, field, "Never" allowed, the reading of an invalid value
# (None: as if unset), what that reading does).
_DURATIONS = (
    (("spec", "template", "spec"), "expireAfter", True, NEVER, "read as Never: no node of the pool expires"),
    (
        ("spec", "template", "spec"),
        "terminationGracePeriod",
        False,
        None,
        "read as unset: no drain deadline, PDBs and do-not-disrupt are waited for",
    ),
    (("spec", "disruption"), "consolidateAfter", True, NEVER, "read as Never: nothing is consolidated"),
)


def _with(raw: Mapping[str, Any], path: tuple[str, ...], field: str, value: Any) -> dict[str, Any]:
    """A copy of `raw` with raw[path...][field] set to `value` (removed for None); the rest shared."""
    if not path:
        out = {k: v for k, v in raw.items() if k != field}
        if value is not None:
            out[field] = value
        return out
    inner = raw.get(path[0])
    return {**raw, path[0]: _with(inner if isinstance(inner, Mapping) else {}, path[1:], field, value)}


def _section(raw: Mapping[str, Any], path: tuple[str, ...]) -> Mapping[str, Any] | None:
    section = raw
    for key in path:
        value = section.get(key)
        if not isinstance(value, Mapping):
            return None
        section = value
    return section


def read_nodepool(raw: Mapping[str, Any]) -> tuple[NodePool, list[str]]:
    """A v1 NodePool as karpflow reads it, and every setting that is invalid (the pool fails closed
    for voluntary disruption until it is fixed, like an invalid budget in Karpenter).

    karpflow.dev/* annotations replace spec.disruption; an invalid expireAfter or consolidateAfter
    reads as Never and an invalid terminationGracePeriod as unset; an invalid budget is dropped.
    Anything else invalid raises ValidationError, as `NodePool.model_validate` does."""
    raw, problems = apply_disruption_overrides(raw)
    problems = list(problems)
    for path, field, never_ok, fail_closed, read_as in _DURATIONS:
        section = _section(raw, path)
        if section is None or field not in section:
            continue
        value = section[field]
        if value is None:  # kube-apiserver prunes a null: the default applies
            raw = _with(raw, path, field, None)
            continue
        try:
            karpenter_duration(value, never_ok=never_ok)
        except DurationError as err:
            problems.append(f"{'.'.join((*path, field))}: {err} ({read_as})")
            raw = _with(raw, path, field, fail_closed)
    disruption = _section(raw, ("spec", "disruption"))
    if disruption is not None and isinstance(disruption.get("budgets"), list):
        kept = []
        for index, budget in enumerate(disruption["budgets"]):
            try:
                Budget.model_validate(budget)
                kept.append(budget)
            except ValidationError as err:
                problems.append(f"spec.disruption.budgets[{index}]: {pydantic_message(err)}")
        if len(kept) != len(disruption["budgets"]):
            raw = _with(raw, ("spec", "disruption"), "budgets", kept)
    raw = _read_capacity_settings(raw, problems)
    return NodePool.model_validate(raw), problems


def _read_capacity_settings(raw: Mapping[str, Any], problems: list[str]) -> Mapping[str, Any]:
    """`spec.replicas` and `spec.limits` read fail closed: an invalid replica count as 0 (a static pool
    that is never consolidated and whose drift waits), an invalid limit as 0 (nothing launches)."""
    spec = _section(raw, ("spec",))
    if spec is None:
        return raw
    replicas = spec.get("replicas")
    if "replicas" in spec and replicas is None:
        raw = _with(raw, ("spec",), "replicas", None)
    elif replicas is not None and (type(replicas) is not int or replicas < 0):
        problems.append(
            f"spec.replicas: {replicas!r} is not a count of nodes (read as 0: the pool is static, never "
            "consolidated, and its drift waits)"
        )
        raw = _with(raw, ("spec",), "replicas", 0)
    limits = spec.get("limits")
    if isinstance(limits, Mapping):
        read: dict[str, Any] = {}
        for name, value in limits.items():
            try:
                if isinstance(value, bool):
                    raise QuantityError(f"{value!r} is not a quantity")
                amount = millicores(value) if name == "cpu" else to_int(value)
                if amount < 0:
                    raise QuantityError(f"{value!r} is negative")
                read[name] = value
            except (QuantityError, TypeError, ValueError) as err:
                problems.append(f"spec.limits.{name}: {err} (read as 0: no replacement launches into it)")
                read[name] = "0"
        if read != dict(limits):
            raw = _with(raw, ("spec",), "limits", read)
    return raw


def _valid(value: str | None) -> timedelta | None:
    try:
        return parse_optional_duration(value)
    except DurationError:  # cannot happen for a validated model; reads as "nothing" if it does
        return None


def pool_expire_after(pool: NodePool) -> timedelta | None:
    """The pool's expireAfter for karpflow: the annotation, else the template's; None is Never."""
    override = overrides_of(pool).expire_after
    return _valid(override if override is not None else pool.spec.template.spec.expire_after)


def pool_termination_grace_period(pool: NodePool) -> timedelta | None:
    """The pool's terminationGracePeriod for karpflow: the annotation, else the template's; None is no
    deadline (also the reading of an invalid value)."""
    override = overrides_of(pool).termination_grace_period
    return _valid(override if override is not None else pool.spec.template.spec.termination_grace_period)
