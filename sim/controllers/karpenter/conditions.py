"""Status conditions as Karpenter writes them: awslabs/operatorpkg's `status.ConditionSet`
(status/condition_set.go), which kubernetes-sigs/karpenter's NodeClaim uses with the root condition
Ready over Launched, Registered and Initialized (pkg/apis/v1/nodeclaim_status.go).

- A condition is set by type: the same status, reason and message at the object's generation
  change nothing; anything else replaces it with a new `lastTransitionTime` and
  `observedGeneration`. The list is kept sorted by type (for kubectl).
- After any condition but the root is set, the root is recomputed: True (reason Ready) when every
  dependent is True at the current generation; otherwise False (UnhealthyDependents) if one of them
  is False at the current generation, else Unknown (ReconcilingDependents), the message naming the
  dependents that are not yet True (`Registered=Unknown, Initialized=Unknown`), latest change first.
- The dependents and the root that are missing start as Unknown (AwaitingReconciliation, "object is
  awaiting reconciliation"): what `StatusConditions()` does to a NodeClaim before its first write.

A NodeClaim's spec is immutable (its CRD's CEL rule), so its generation stays 1.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

Obj = dict[str, Any]
ROOT = "Ready"
NODECLAIM_DEPENDENTS = ("Launched", "Registered", "Initialized")
AWAITING = ("AwaitingReconciliation", "object is awaiting reconciliation")


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(status: Obj, kind: str) -> Obj | None:
    return next((c for c in status.get("conditions") or () if c.get("type") == kind), None)


def _put(status: Obj, kind: str, value: str, reason: str, message: str, generation: int, at: str) -> bool:
    conditions = [c for c in status.get("conditions") or () if c.get("type") != kind]
    old = condition(status, kind)
    if (
        old is not None
        and (old.get("status"), old.get("reason"), old.get("message") or "") == (value, reason, message)
        and old.get("observedGeneration") == generation
    ):
        return False
    conditions.append(
        {
            "type": kind,
            "status": value,
            "observedGeneration": generation,
            "lastTransitionTime": at,
            "reason": reason,
            "message": message,
        }
    )
    status["conditions"] = sorted(conditions, key=lambda c: str(c.get("type")))
    return True


def _recompute_root(status: Obj, dependents: tuple[str, ...], generation: int, at: str) -> None:
    unhealthy = [
        c
        for c in status.get("conditions") or ()
        if c.get("type") in dependents
        and (c.get("status") != "True" or c.get("observedGeneration") != generation)
    ]
    if not unhealthy:
        _put(status, ROOT, "True", ROOT, "", generation, at)
        return
    unhealthy.sort(key=lambda c: str(c.get("lastTransitionTime") or ""), reverse=True)
    failed = any(c.get("status") == "False" and c.get("observedGeneration") == generation for c in unhealthy)
    _put(
        status,
        ROOT,
        "False" if failed else "Unknown",
        "UnhealthyDependents" if failed else "ReconcilingDependents",
        ", ".join(f"{c['type']}={c.get('status')}" for c in unhealthy),
        generation,
        at,
    )


def set_condition(
    status: Obj,
    kind: str,
    value: str,
    reason: str,
    message: str = "",
    *,
    generation: int = 1,
    dependents: tuple[str, ...] = NODECLAIM_DEPENDENTS,
    at: str | None = None,
) -> bool:
    """`ConditionSet.Set` on a status in place, then the root recomputed; True when it changed."""
    at = at or now_rfc3339()
    changed = _put(status, kind, value, reason, message, generation, at)
    if changed and kind != ROOT:
        _recompute_root(status, dependents, generation, at)
    return changed


def initialize(
    status: Obj,
    *,
    generation: int = 1,
    dependents: tuple[str, ...] = NODECLAIM_DEPENDENTS,
    at: str | None = None,
) -> bool:
    """`ConditionTypes.For`: the dependents and the root that are missing set Unknown."""
    changed = False
    for kind in (*dependents, ROOT):
        if condition(status, kind) is None:
            changed |= set_condition(status, kind, "Unknown", *AWAITING, generation=generation, at=at)
    return changed
