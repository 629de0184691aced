"""How karpflow reads a NodePool from a cluster: every setting that is invalid reads as the value that
disrupts nothing, and is reported (issue 17: a negative expireAfter expired a whole pool, again and
again).

- karpflow.dev/* annotations replace spec.disruption (api/karpflow_overrides.py);
- an invalid expireAfter or consolidateAfter reads as Never, an invalid terminationGracePeriod as
  unset (no drain deadline: PDBs and do-not-disrupt are waited for, never a deadline in the past);
- an invalid budget is dropped;
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
    return NodePool.model_validate(raw), problems


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
