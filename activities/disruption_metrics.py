"""Karpenter's labels for a disrupted node, and the pods its disruption displaces.

When a disruption deletes a node, Karpenter counts it in `karpenter_nodeclaims_disrupted_total` and
adds the node's reschedulable pods to `karpenter_pods_disruption_initiated_total` (kubernetes-sigs/
karpenter #3015, on main after v1.14.1: pkg/metrics/metrics.go `PodsDisruptionInitiatedTotal`,
incremented in pkg/controllers/disruption/queue.go `waitOrTerminate` and by the expiration, health
and garbage-collection controllers). Both carry the same five labels (#3179):

- `reason`, `nodepool`, `capacity_type` as before;
- `consolidation_policy`: the NodePool's consolidationPolicy in snake case (`when_empty`,
  `when_empty_or_underutilized`, `balanced`) for a consolidation command (Karpenter's methods with a
  consolidation type: emptiness, multi- and single-node consolidation), "" for every other reason:
  drift flows through the same queue, and a policy is no answer to why a drifted node went;
- `termination_mode`: how the node's drain is bounded, from the terminationGracePeriod (Karpenter's
  pkg/utils/nodeclaim `DisruptionTerminationMode`): none `graceful` (PDBs and do-not-disrupt are
  waited for), zero or less `forceful`, positive `eventual`.

The pods counted are the ones on the node just before it is deleted, as Karpenter lists them before
the drain starts: active pods and terminating StatefulSet pods, not DaemonSet or mirror pods
(pkg/utils/pod/scheduling.go `IsReschedulable`).

Pure: the activity that deletes the node (activities/termination_steps.py) and the garbage
collection (activities/garbage_collection.py) record with these.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import timedelta

from api.constants import REASON_EMPTY, REASON_UNDERUTILIZED
from kube.client import Json
from kube.drain_rules import Pod

# The reasons of karpflow's consolidation commands (emptiness, multi- and single-node and Optimal
# consolidation); drift, static drift, expiration, repair and interruption have no policy.
CONSOLIDATION_REASONS = frozenset({REASON_EMPTY, REASON_UNDERUTILIZED})

TERMINATION_MODE_GRACEFUL = "graceful"
TERMINATION_MODE_EVENTUAL = "eventual"
TERMINATION_MODE_FORCEFUL = "forceful"

_FIRST_CAP = re.compile(r"(.)([A-Z][a-z]+)")
_ALL_CAP = re.compile(r"([a-z0-9])([A-Z])")


def snake_case(name: str) -> str:
    """`WhenEmptyOrUnderutilized` → `when_empty_or_underutilized`, as Karpenter's pretty.ToSnakeCase."""
    return _ALL_CAP.sub(r"\1_\2", _FIRST_CAP.sub(r"\1_\2", name)).lower()


def consolidation_policy_label(reason: str, policy: str | None) -> str:
    """The `consolidation_policy` label: the pool's policy for a consolidation, else ""."""
    if reason not in CONSOLIDATION_REASONS or not policy:
        return ""
    return snake_case(policy)


def termination_mode(grace: timedelta | None) -> str:
    """The `termination_mode` label of a node drained within `grace` (None: no bound)."""
    if grace is None:
        return TERMINATION_MODE_GRACEFUL
    if grace <= timedelta(0):
        return TERMINATION_MODE_FORCEFUL
    return TERMINATION_MODE_EVENTUAL


def reschedulable_pods(pods: Iterable[Json]) -> int:
    """How many of a node's pods its disruption displaces (Karpenter's IsReschedulable)."""
    count = 0
    for raw in pods:
        pod = Pod(raw)
        if pod.daemonset or pod.mirror or pod.terminal:
            continue
        if pod.terminating and pod.owner_kind != "StatefulSet":
            continue
        count += 1
    return count


def disruption_labels(
    *,
    reason: str,
    nodepool: str,
    capacity_type: str,
    policy: str | None,
    grace: timedelta | None,
) -> dict[str, str]:
    """The five labels of both series for one disrupted node."""
    return {
        "reason": reason,
        "nodepool": nodepool,
        "capacity_type": capacity_type,
        "consolidation_policy": consolidation_policy_label(reason, policy),
        "termination_mode": termination_mode(grace),
    }
