"""What the simulated scheduler checks of one pod against one node (pure functions on JSON dicts).

kube-scheduler's node-local filter plugins, in the default profile's order, each with the reason it
gives (kubernetes/kubernetes v1.33-v1.35, pkg/scheduler/framework/plugins/):
- NodeUnschedulable (nodeunschedulable/node_unschedulable.go): a cordoned node takes only pods
  tolerating `node.kubernetes.io/unschedulable:NoSchedule` — "node(s) were unschedulable";
- TaintToleration (tainttoleration/taint_toleration.go): the first NoSchedule / NoExecute taint the
  pod does not tolerate — "node(s) had untolerated taint {key: value}". A node that is not Ready is
  treated as carrying `node.kubernetes.io/not-ready:NoSchedule`, which the node lifecycle controller
  puts on it in a real cluster (the simulated one does too; nodes made by hand in tests may not);
- NodeAffinity (nodeaffinity/node_affinity.go): PreFilter narrows the nodes to those a required
  `matchFields metadata.name In` term names (a DaemonSet pod's pin) — the others are "node(s) didn't
  satisfy plugin(s) [NodeAffinity]" —, then `spec.nodeSelector` (all labels equal) and the required
  terms (ORed; expressions ANDed; In, NotIn, Exists, DoesNotExist, Gt, Lt; matchFields on
  metadata.name) — "node(s) didn't match Pod's node affinity/selector";
- NodePorts (nodeports/node_ports.go): the pod's container hostPorts are free on the node (a port on
  0.0.0.0 takes it on every address) — "node(s) didn't have free ports for the requested pod ports";
- NodeResourcesFit (noderesources/fit.go `fitsRequest`): one more pod fits `allocatable.pods`, and
  every resource the pod requests (> 0) fits allocatable minus what the node's pods request —
  "Too many pods", "Insufficient cpu", ...

The pod's requests are component-helpers' `PodRequests` (resource/helpers.go): the containers' sum,
raised to the largest init container (sidecars, restartPolicy Always, run alongside and add up),
plus the overhead; limits stand in for missing requests, as API defaulting does. Scoring uses the
"non-zero" variant (100m cpu / 200Mi memory for a container that requests none:
pkg/scheduler/util/pod_resources.go).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from api.constants import NOT_READY_TAINT_KEY
from planner.resources import ZERO, Resources

SCHEDULING_EFFECTS = ("NoSchedule", "NoExecute")
UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
NOT_READY_TAINT = {"key": NOT_READY_TAINT_KEY, "effect": "NoSchedule"}
ONE_POD = Resources(pods=1)
DEFAULT_MILLI_CPU_REQUEST = 100  # pkg/scheduler/util: what scoring assumes for a container without one
DEFAULT_MEMORY_REQUEST = 200 * 1024 * 1024

REASON_UNSCHEDULABLE = "node(s) were unschedulable"
REASON_NODE_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
REASON_PREFILTER_NODE_AFFINITY = "node(s) didn't satisfy plugin(s) [NodeAffinity]"
REASON_PORTS = "node(s) didn't have free ports for the requested pod ports"
REASON_TOO_MANY_PODS = "Too many pods"


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


def _node_affinity(pod_spec: Mapping[str, Any]) -> Mapping[str, Any]:
    return (pod_spec.get("affinity") or {}).get("nodeAffinity") or {}


def required_node_affinity(pod_spec: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    """The required NodeSelectorTerms, or None when the pod has no required node affinity."""
    required = _node_affinity(pod_spec).get("requiredDuringSchedulingIgnoredDuringExecution") or None
    if required is None:
        return None
    return list(required.get("nodeSelectorTerms") or ())


def node_selection_matches(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """nodeSelector and required node affinity (component-helpers nodeaffinity.RequiredNodeAffinity)."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    terms = required_node_affinity(pod_spec)
    if terms is None:
        return True
    return any(term_matches(t, labels, meta.get("name", "")) for t in terms)


def prefilter_node_names(pod_spec: Mapping[str, Any]) -> frozenset[str] | None:
    """NodeAffinity's PreFilter: the node names every required term pins with `matchFields
    metadata.name In` (a term's pins intersected, the terms' united), or None when any term pins
    none (every node is then a candidate)."""
    terms = required_node_affinity(pod_spec)
    if not terms:
        return None
    names: set[str] = set()
    for term in terms:
        pinned: set[str] | None = None
        for expr in term.get("matchFields") or ():
            if expr.get("key") == "metadata.name" and expr.get("operator") == "In":
                values = set(expr.get("values") or ())
                pinned = values if pinned is None else pinned & values
        if pinned is None:
            return None
        names |= pinned
    return frozenset(names)


def preferred_node_affinity_score(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> int:
    """NodeAffinity's raw score: the weights of the preferred terms the node matches (empty terms
    and weight 0 count for nothing: component-helpers NewPreferredSchedulingTerms)."""
    terms = _node_affinity(pod_spec).get("preferredDuringSchedulingIgnoredDuringExecution") or ()
    if not terms:
        return 0
    meta = node.get("metadata") or {}
    labels, name = meta.get("labels") or {}, meta.get("name", "")
    return sum(
        int(t.get("weight") or 0)
        for t in terms
        if t.get("weight") and term_matches(t.get("preference") or {}, labels, name)
    )


# --- node state -----------------------------------------------------------------------------------


def node_condition(node: Mapping[str, Any], kind: str) -> str | None:
    for cond in (node.get("status") or {}).get("conditions") or ():
        if cond.get("type") == kind:
            status = cond.get("status")
            return None if status is None else str(status)
    return None


def node_ready(node: Mapping[str, Any]) -> bool:
    return node_condition(node, "Ready") == "True"


def node_taints_for_scheduling(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The taints the scheduler sees: the node's own, the unschedulable taint of a cordoned node and
    the not-ready taint of a node that is not Ready (both put there by the node lifecycle
    controller in a real cluster)."""
    spec = node.get("spec") or {}
    taints = list(spec.get("taints") or ())
    keys = {t.get("key") for t in taints}
    if spec.get("unschedulable") and UNSCHEDULABLE_TAINT["key"] not in keys:
        taints.append(UNSCHEDULABLE_TAINT)
    if not node_ready(node) and NOT_READY_TAINT_KEY not in keys:
        taints.append(NOT_READY_TAINT)
    return taints


def static_failure(
    pod_spec: Mapping[str, Any], node: Mapping[str, Any], pinned: frozenset[str] | None = None
) -> str | None:
    """Why the first of NodeUnschedulable, TaintToleration and NodeAffinity refuses the node (None:
    they all pass). `pinned`: NodeAffinity's PreFilter names (`prefilter_node_names`)."""
    if pinned is not None and (node.get("metadata") or {}).get("name") not in pinned:
        return REASON_PREFILTER_NODE_AFFINITY
    tolerations = pod_spec.get("tolerations") or ()
    if (node.get("spec") or {}).get("unschedulable") and not tolerated(tolerations, UNSCHEDULABLE_TAINT):
        return REASON_UNSCHEDULABLE
    for taint in untolerated_taints(tolerations, node_taints_for_scheduling(node)):
        return f"node(s) had untolerated taint {{{taint.get('key', '')}: {taint.get('value') or ''}}}"
    if not node_selection_matches(pod_spec, node):
        return REASON_NODE_AFFINITY
    return None


def node_accepts(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Every node-local predicate except ports and resources: cordon, taints (readiness), selector and
    required node affinity."""
    return static_failure(pod_spec, node, prefilter_node_names(pod_spec)) is None


def preferred_against(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> int:
    """TaintToleration's raw score: the node's PreferNoSchedule taints the pod does not tolerate (the
    more, the less the node is preferred)."""
    tolerations = pod_spec.get("tolerations") or ()
    taints = (node.get("spec") or {}).get("taints") or ()
    return sum(1 for t in taints if t.get("effect") == "PreferNoSchedule" and not tolerated(tolerations, t))


# --- host ports ------------------------------------------------------------------------------------


class HostPort(NamedTuple):
    protocol: str
    ip: str
    port: int


ANY_IP = "0.0.0.0"


def host_ports(pod_spec: Mapping[str, Any]) -> tuple[HostPort, ...]:
    """The pod's containers' host ports (> 0), protocol TCP and address 0.0.0.0 when unset."""
    found = []
    for container in pod_spec.get("containers") or ():
        for port in container.get("ports") or ():
            number = _int(port.get("hostPort")) or 0
            if number > 0:
                found.append(HostPort(port.get("protocol") or "TCP", port.get("hostIP") or ANY_IP, number))
    return tuple(found)


def ports_conflict(wanted: Iterable[HostPort], used: Counter[HostPort]) -> bool:
    """HostPortInfo.CheckConflict: 0.0.0.0 conflicts with the port on any address, an address with
    itself and with 0.0.0.0."""
    if not used:
        return False
    for want in wanted:
        if want.ip == ANY_IP:
            if any(u.port == want.port and u.protocol == want.protocol for u in used):
                return True
        elif used.get(want) or used.get(HostPort(want.protocol, ANY_IP, want.port)):
            return True
    return False


# --- resources ----------------------------------------------------------------------------------


def _container_requests(container: Mapping[str, Any]) -> Resources:
    resources = container.get("resources") or {}
    requests = dict(resources.get("limits") or {})
    requests.update(resources.get("requests") or {})
    return Resources.from_kube(requests) if requests else ZERO


def _nonzero_container_requests(container: Mapping[str, Any]) -> Resources:
    resources = container.get("resources") or {}
    named = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    found = Resources.from_kube(named) if named else ZERO
    return Resources(
        found.cpu if "cpu" in named else DEFAULT_MILLI_CPU_REQUEST,
        found.memory if "memory" in named else DEFAULT_MEMORY_REQUEST,
    )


def _pod_total(
    pod_spec: Mapping[str, Any], per_container: Callable[[Mapping[str, Any]], Resources]
) -> Resources:
    total = ZERO
    for container in pod_spec.get("containers") or ():
        total = total + per_container(container)
    init_containers = pod_spec.get("initContainers")
    if init_containers:
        sidecars = ZERO
        init = ZERO
        for container in init_containers:
            request = per_container(container)
            if container.get("restartPolicy") == "Always":
                # A sidecar runs alongside everything after it, the app containers included.
                total = total + request
                sidecars = sidecars + request
                init = init.max(sidecars)
            else:
                init = init.max(request + sidecars)
        total = total.max(init)
    overhead = pod_spec.get("overhead")
    if overhead:
        total = total + Resources.from_kube(overhead)
    return total


def pod_requests(pod_spec: Mapping[str, Any]) -> Resources:
    """What the scheduler reserves for the pod, one `pods` slot included."""
    return _pod_total(pod_spec, _container_requests) + ONE_POD


def pod_nonzero_requests(pod_spec: Mapping[str, Any]) -> tuple[int, int]:
    """(millicores, bytes) as scoring counts them: 100m / 200Mi for a container naming none."""
    total = _pod_total(pod_spec, _nonzero_container_requests)
    return total.cpu, total.memory


def insufficient_resources(request: Resources, used: Resources, allocatable: Resources) -> list[str]:
    """NodeResourcesFit's reasons, in its order (empty when the pod fits)."""
    reasons = []
    if used.pods + 1 > allocatable.pods:
        reasons.append(REASON_TOO_MANY_PODS)
    if request.cpu > 0 and request.cpu > allocatable.cpu - used.cpu:
        reasons.append("Insufficient cpu")
    if request.memory > 0 and request.memory > allocatable.memory - used.memory:
        reasons.append("Insufficient memory")
    if request.ephemeral_storage > 0 and request.ephemeral_storage > (
        allocatable.ephemeral_storage - used.ephemeral_storage
    ):
        reasons.append("Insufficient ephemeral-storage")
    for name in sorted(request.extended):
        want = request.extended[name]
        if want > 0 and want > allocatable.extended.get(name, 0) - used.extended.get(name, 0):
            reasons.append(f"Insufficient {name}")
    return reasons


def resources_fit(request: Resources, used: Resources, allocatable: Resources) -> bool:
    if used.pods + 1 > allocatable.pods:
        return False
    if request.cpu > 0 and request.cpu > allocatable.cpu - used.cpu:
        return False
    if request.memory > 0 and request.memory > allocatable.memory - used.memory:
        return False
    if request.ephemeral_storage > 0 and request.ephemeral_storage > (
        allocatable.ephemeral_storage - used.ephemeral_storage
    ):
        return False
    return all(
        want <= 0 or want <= allocatable.extended.get(name, 0) - used.extended.get(name, 0)
        for name, want in request.extended.items()
    )


def node_allocatable(node: Mapping[str, Any]) -> Resources:
    status = node.get("status") or {}
    return Resources.from_kube(status.get("allocatable") or status.get("capacity") or {})


def pod_is_terminal(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
