"""What the simulated scheduler checks before binding a pod to a node (pure functions on JSON dicts).

The rules are kube-scheduler's filter plugins, reduced to what karpflow's scenarios exercise:
- NodeUnschedulable: a cordoned node takes only pods tolerating `node.kubernetes.io/unschedulable`;
- TaintToleration: every NoSchedule / NoExecute taint must be tolerated (PreferNoSchedule is a
  preference: `preferred_against` counts them for scoring, see scheduler.py);
- NodeAffinity: `spec.nodeSelector` (all labels equal) and the required node affinity (terms ORed,
  expressions ANDed; In, NotIn, Exists, DoesNotExist, Gt, Lt; matchFields on metadata.name);
- NodeResourcesFit: requests of the pod (max of the init containers vs the sum of the containers,
  plus overhead; limits stand in for missing requests, as API defaulting does) fit the node's
  allocatable minus what its bound, non-terminal pods request; every pod counts one `pods`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from api.constants import NOT_READY_TAINT_KEY
from planner.resources import ZERO, Resources

SCHEDULING_EFFECTS = ("NoSchedule", "NoExecute")
UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
ONE_POD = Resources(pods=1)


# --- taints and tolerations ---------------------------------------------------------------------


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Kubernetes `Toleration.ToleratesTaint`."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if not key:
        # An empty key with Exists tolerates everything (of the matching effect).
        return operator == "Exists"
    if key != taint.get("key"):
        return False
    if operator == "Exists":
        return True
    return (toleration.get("value") or "") == (taint.get("value") or "")


def tolerated(tolerations: Iterable[Mapping[str, Any]] | None, taint: Mapping[str, Any]) -> bool:
    return any(tolerates(t, taint) for t in tolerations or ())


def untolerated_taints(
    tolerations: Iterable[Mapping[str, Any]] | None,
    taints: Iterable[Mapping[str, Any]] | None,
    effects: Iterable[str] = SCHEDULING_EFFECTS,
) -> list[Mapping[str, Any]]:
    wanted = set(effects)
    tols = list(tolerations or ())
    return [t for t in taints or () if t.get("effect") in wanted and not tolerated(tols, t)]


# --- node selection -----------------------------------------------------------------------------


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def expression_matches(expr: Mapping[str, Any], value: str | None) -> bool:
    """One NodeSelectorRequirement against the label (or field) value, None when absent."""
    operator = expr.get("operator")
    values = expr.get("values") or ()
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt"):
        have, want = _int(value), _int(values[0] if values else None)
        if have is None or want is None:
            return False
        return have > want if operator == "Gt" else have < want
    return False  # unknown operators select nothing, as the API would have refused them


def term_matches(term: Mapping[str, Any], labels: Mapping[str, str], node_name: str) -> bool:
    """A NodeSelectorTerm: its expressions ANDed; a term with no expressions matches nothing."""
    expressions = term.get("matchExpressions") or ()
    fields = term.get("matchFields") or ()
    if not expressions and not fields:
        return False
    for expr in expressions:
        if not expression_matches(expr, labels.get(expr.get("key", ""))):
            return False
    for expr in fields:
        value = node_name if expr.get("key") == "metadata.name" else None
        if not expression_matches(expr, value):
            return False
    return True


def required_node_affinity(pod_spec: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    """The required NodeSelectorTerms, or None when the pod has no required node affinity."""
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or None
    if required is None:
        return None
    return list(required.get("nodeSelectorTerms") or ())


def node_selection_matches(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    terms = required_node_affinity(pod_spec)
    if terms is None:
        return True
    return any(term_matches(t, labels, meta.get("name", "")) for t in terms)


# --- node state -----------------------------------------------------------------------------------


def node_condition(node: Mapping[str, Any], kind: str) -> str | None:
    for cond in (node.get("status") or {}).get("conditions") or ():
        if cond.get("type") == kind:
            return cond.get("status")
    return None


def node_ready(node: Mapping[str, Any]) -> bool:
    return node_condition(node, "Ready") == "True"


def node_taints_for_scheduling(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The node's taints plus the implicit unschedulable taint of a cordoned node."""
    spec = node.get("spec") or {}
    taints = list(spec.get("taints") or ())
    if spec.get("unschedulable") and not any(t.get("key") == UNSCHEDULABLE_TAINT["key"] for t in taints):
        taints.append(UNSCHEDULABLE_TAINT)
    return taints


def node_accepts(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Every predicate except resources: readiness, cordon, taints, selector and affinity.

    A node that is not Ready only takes pods that tolerate the not-ready taint (DaemonSet pods), as
    on a real cluster where the node lifecycle controller taints such nodes.
    """
    tolerations = pod_spec.get("tolerations") or ()
    if not node_ready(node) and not tolerated(
        tolerations, {"key": NOT_READY_TAINT_KEY, "effect": "NoSchedule"}
    ):
        return False
    if untolerated_taints(tolerations, node_taints_for_scheduling(node)):
        return False
    return node_selection_matches(pod_spec, node)


# --- resources ----------------------------------------------------------------------------------


def _container_requests(container: Mapping[str, Any]) -> Resources:
    resources = container.get("resources") or {}
    requests = dict(resources.get("limits") or {})
    requests.update(resources.get("requests") or {})
    return Resources.from_kube(requests) if requests else ZERO


def pod_requests(pod_spec: Mapping[str, Any]) -> Resources:
    """What the scheduler reserves for the pod, one `pods` slot included."""
    total = ZERO
    for container in pod_spec.get("containers") or ():
        total = total + _container_requests(container)
    for container in pod_spec.get("initContainers") or ():
        request = _container_requests(container)
        # A sidecar (restartPolicy Always) runs alongside the app containers; others run before them.
        total = total + request if container.get("restartPolicy") == "Always" else total.max(request)
    overhead = pod_spec.get("overhead")
    if overhead:
        total = total + Resources.from_kube(overhead)
    return total + ONE_POD


def node_allocatable(node: Mapping[str, Any]) -> Resources:
    status = node.get("status") or {}
    return Resources.from_kube(status.get("allocatable") or status.get("capacity") or {})


def pod_is_terminal(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def least_allocated_score(allocatable: Resources, used: Resources) -> float:
    """kube-scheduler's LeastAllocated: the mean free fraction of cpu and memory (higher is better)."""
    scores = []
    for have, taken in ((allocatable.cpu, used.cpu), (allocatable.memory, used.memory)):
        scores.append((have - taken) / have if have > 0 else 0.0)
    return sum(scores) / len(scores)


def preferred_against(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> int:
    """kube-scheduler's TaintToleration score input: the node's PreferNoSchedule taints the pod does
    not tolerate (the more, the less the node is preferred)."""
    tolerations = pod_spec.get("tolerations") or ()
    taints = (node.get("spec") or {}).get("taints") or ()
    return sum(1 for t in taints if t.get("effect") == "PreferNoSchedule" and not tolerated(tolerations, t))
