"""Karpenter's eviction cost of a pod, and "empty" measured by it: one definition for the planner's
parsed pods and for the guard that reads a node's pods at the moment of its taint.

From kubernetes-sigs/karpenter (v1.14):
- a pod's eviction cost is 1.0, plus its `controller.kubernetes.io/pod-deletion-cost` / 2^27, plus its
  priority / 2^25, clamped to [-10, 10] (pkg/utils/disruption/disruption.go `EvictionCost`);
- a node's reschedule disruption cost is 1.0 for the node itself plus max(0, eviction cost) of each
  pod that must move (pkg/controllers/disruption/types.go `computeRescheduleDisruptionCost`);
- a node is empty when that cost is at most 1.0, i.e. no moving pod has a positive eviction cost
  (`Candidate.IsEmpty`): a node whose pods all carry a very negative deletion cost (at most about
  -2^27) or priority is deleted by Emptiness, without a scheduling simulation; its pods are
  evicted by the drain as usual.

The pod-deletion-cost annotation is an int32 (the API server validates it; an unparsable value
counts as 0 here, where Karpenter logs it and ignores it too).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from api.constants import POD_DELETION_COST_ANNOTATION

PER_NODE_BASE_DISRUPTION_COST = 1.0  # Karpenter's PerNodeBaseDisruptionCost
MAX_EVICTION_COST = 10.0


def deletion_cost(annotations: Mapping[str, str]) -> int:
    """The pod's `controller.kubernetes.io/pod-deletion-cost` (0 when absent or not an integer)."""
    try:
        return int(annotations.get(POD_DELETION_COST_ANNOTATION, 0))
    except (TypeError, ValueError):
        return 0


def eviction_cost(annotations: Mapping[str, str], priority: int) -> float:
    """Karpenter's per-pod cost: 1 + deletion-cost/2^27 + priority/2^25, clamped to [-10, 10]."""
    cost = 1.0 + deletion_cost(annotations) / 2**27 + priority / 2**25
    return min(MAX_EVICTION_COST, max(-MAX_EVICTION_COST, cost))


def reschedule_disruption_cost(eviction_costs: Iterable[float]) -> float:
    """1.0 for the node plus the eviction cost of each moving pod, negative costs counting as 0."""
    return PER_NODE_BASE_DISRUPTION_COST + sum(max(0.0, cost) for cost in eviction_costs)


def empty_by_eviction_cost(eviction_costs: Iterable[float]) -> bool:
    """Karpenter's `Candidate.IsEmpty`: no moving pod adds a positive eviction cost."""
    return reschedule_disruption_cost(eviction_costs) <= PER_NODE_BASE_DISRUPTION_COST
