"""The guards checked at the moment of acting, before the first change to a node.

Every workflow can be started by hand with any input, so the planner's filters are not enough: the
activity that takes a step checks again, refuses with a non-retryable `Refused` error that names the
node and the rule, and changes nothing when it refuses.

- Managed: the node carries `karpenter.sh/nodepool`, that NodePool exists (or the command is a
  NodePool deletion's), the node has an AWS providerID, and its instance carries this cluster's
  `kubernetes.io/cluster/<name>: owned` tag and a `karpenter.sh/nodepool` tag naming the same
  NodePool as the node's label. The launch sets both tags (Karpenter's and karpflow's); an EKS
  managed node group's instance carries the cluster tag too, and a kubelet can label itself with
  any NodePool, so neither alone says the node is ours. Checked before the disrupted taint, the finalizer or
  the delete. An EKS managed node group's node, a hand-made node, or a Ready node whose providerID
  points nowhere is refused; a NotReady node whose instance is gone is not (nothing is left to
  protect, and only its termination can release it).
- Voluntary disruption (Underutilized, Empty, Drifted) also re-checks `karpenter.sh/do-not-disrupt`
  on the node and on its active pods, and refuses a node that another command holds. Drift of a
  node whose NodePool sets a terminationGracePeriod is Karpenter's eventual class: its pods'
  do-not-disrupt does not refuse it (the grace period bounds the drain), the node's own does. The holder is
  recorded in the annotation `karpflow.io/disruption-command` beside the taint; tainting again
  under the same command is idempotent. An emptiness command leaves out a node that is no longer
  empty by Karpenter's eviction-cost rule (a pod with a positive eviction cost landed after the
  planner's validation, and the command has no replacement for it), checked
  before the taint and again after it, and goes on with the candidates still empty; with none left
  it fails without changing anything.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from pydantic import ValidationError

from activities.errors import REFUSED, permanent
from api.activity_io import InstanceState
from api.constants import (
    DISRUPTED_TAINT_KEY,
    DISRUPTION_TAINT_KEYS,
    DO_NOT_REPAIR_ANNOTATION,
    EXPIRATION_DEFERRED_ANNOTATION,
    HOLDER_ANNOTATION,
    INITIALIZED_LABEL,
    KARPFLOW_DISRUPTED_TAINT_KEY,
    KARPFLOW_GROUP,
    KARPFLOW_VERSION,
    NODEPOOL_LABEL,
    TAG_NODEPOOL,
)
from api.nodepool_reader import pool_termination_grace_period, read_nodepool
from api.workflow_io import VOLUNTARY_REASONS
from cluster.reads import ClusterReads
from kube.client import Json, KubeApi
from kube.drain_rules import Pod
from kube.eviction_cost import PER_NODE_BASE_DISRUPTION_COST, reschedule_disruption_cost
from kube.pods import node_do_not_disrupt_reason
from planner.maintenance_windows import ACTION_OF_REASON, Window, blocked, read_window

OWNER_ANNOTATION = HOLDER_ANNOTATION
NODEPOOL_DELETED = "NodePoolDeleted"
DRIFTED = "Drifted"
UNHEALTHY = "Unhealthy"
EXPIRED = "Expired"
MANUAL = "Manual"
WINDOWS_PLURAL = "maintenancewindows"

# instance id -> its state and ownership tags: EC2Activities.ownership, bound by the worker.
OwnershipCheck = Callable[[str], Awaitable[InstanceState]]


class Refused(Exception):
    """A guard said no; `str()` names the node and the rule."""


def refusal(err: Refused) -> Exception:
    return permanent(str(err), REFUSED)


def instance_id_of(provider_id: str | None) -> str | None:
    """`aws:///us-west-2a/i-0123` → `i-0123`."""
    if not provider_id or not provider_id.startswith("aws://"):
        return None
    tail = provider_id.rsplit("/", 1)[-1]
    return tail if tail.startswith("i-") else None


async def check_managed(
    kube: KubeApi,
    node: Json,
    reason: str,
    ownership: OwnershipCheck | None,
    cluster: str = "",
    reads: ClusterReads | None = None,
) -> Json | None:
    """Refuse a node karpflow does not manage; return its NodePool (None if it is gone and the
    command is that NodePool's deletion). A node whose instance is gone passes when it is already
    being deleted or NotReady: there is nothing left to protect, and its finalizer must still be
    released (the termination's "instance already gone" path). `reads`: the NodePool from the
    worker's cache (a pool it does not hold is asked of the server)."""
    name = node["metadata"]["name"]
    pool = (node["metadata"].get("labels") or {}).get(NODEPOOL_LABEL)
    if not pool:
        raise Refused(f"node {name} has no {NODEPOOL_LABEL} label: karpflow does not manage it")
    nodepool = await reads.nodepool(pool) if reads is not None else await _nodepool(kube, pool)
    if reason != NODEPOOL_DELETED and nodepool is None:
        raise Refused(f"node {name} belongs to NodePool {pool}, which does not exist")
    provider_id = (node.get("spec") or {}).get("providerID")
    instance_id = instance_id_of(provider_id)
    if instance_id is None:
        raise Refused(f"node {name} has no AWS providerID ({provider_id or 'none'}): no instance to manage")
    if ownership is not None:
        instance = await ownership(instance_id)
        if not instance.found:
            if not node["metadata"].get("deletionTimestamp") and _ready(node):
                # A live kubelet says the machine exists: a providerID EC2 does not know is not ours.
                # A silent one whose instance is gone leaves nothing to protect: the termination
                # only releases its finalizer (Karpenter's "NotReady and instance not found").
                raise Refused(f"node {name}: its instance {instance_id} does not exist in EC2")
            return nodepool
        if not instance.cluster_owned:
            raise Refused(
                f"node {name}: its instance {instance_id} is not tagged "
                f"kubernetes.io/cluster/{cluster}=owned, so this cluster does not own it"
            )
        if instance.nodepool is None:
            raise Refused(
                f"node {name}: its instance {instance_id} is not tagged {TAG_NODEPOOL}: it was not "
                "launched for a NodePool (an EKS managed node group's instance carries the cluster tag too)"
            )
        if instance.nodepool != pool:
            raise Refused(
                f"node {name} claims NodePool {pool} by label, but its instance {instance_id} is tagged "
                f"{TAG_NODEPOOL}={instance.nodepool}: a label is not proof of ownership"
            )
    return nodepool


async def _nodepool(kube: KubeApi, pool: str) -> Json | None:
    from activities.errors import not_found
    from api.constants import KARPENTER_GROUP, KARPENTER_VERSION

    try:
        return await kube.get_cluster_custom(KARPENTER_GROUP, KARPENTER_VERSION, "nodepools", pool)
    except Exception as err:
        if not_found(err):
            return None
        raise


def raw_termination_grace_period(pool: Json | None) -> timedelta | None:
    """The terminationGracePeriod of a NodePool as the API returned it, read as the planner reads it
    (api.nodepool_reader: the karpflow.dev override, else the template; an invalid one is none, so
    nothing bounds the drain and drift stays graceful). None if the pool does not validate."""
    if pool is None:
        return None
    try:
        return pool_termination_grace_period(read_nodepool(pool)[0])
    except (ValidationError, ValueError):
        return None


def check_voluntary(
    node: Json,
    pods: list[Json],
    reason: str,
    command_id: str,
    now: datetime,
    grace: timedelta | None = None,
    taint_key: str = DISRUPTED_TAINT_KEY,
) -> None:
    """Voluntary reasons only: do-not-disrupt on the node and its active pods, and no other holder.
    `grace`: the NodePool's terminationGracePeriod; with one, drift (Karpenter's eventual class) is
    not refused by a pod's do-not-disrupt, since the drain ends by the grace period anyway."""
    if reason not in VOLUNTARY_REASONS:
        return
    name = node["metadata"]["name"]
    annotations = node["metadata"].get("annotations") or {}
    if (why := node_do_not_disrupt_reason(annotations)) is not None:
        raise Refused(f"node {name} is annotated {why}: no voluntary disruption ({reason})")
    eventual = reason == DRIFTED and grace is not None
    for raw in pods:
        pod = Pod(raw)
        if not eventual and not pod.terminal and not pod.terminating and pod.do_not_disrupt(now):
            raise Refused(
                f"node {name} runs pod {pod.key} annotated do-not-disrupt: no voluntary disruption ({reason})"
            )
    holder = other_holder(node, command_id, taint_key)
    if holder is not None:
        raise Refused(f"node {name} is already held by {holder}: one command at a time")


# -- the operator's controls at the moment of acting (docs/operator-controls.md) --------------------


def is_rebalance(command_id: str) -> bool:
    """The interruption handler's proactive replacement (`interruption/<cluster>/<instance>/rebalance`):
    a MaintenanceWindow's Rebalance action, not Drift, although it runs with reason Drifted."""
    parts = command_id.partition("@")[0].split("/")
    return len(parts) >= 3 and parts[0] == "interruption" and parts[-1] == "rebalance"


def _initialized(node: Json) -> bool:
    return (node["metadata"].get("labels") or {}).get(INITIALIZED_LABEL) == "true"


def window_action(reason: str, command_id: str, node: Json) -> str | None:
    """The MaintenanceWindow action a disruption of `node` for `reason` is (None: no window blocks it:
    interruption, NodePool deletion, `kubectl delete node`, a node that never initialized)."""
    if reason == DRIFTED and is_rebalance(command_id):
        return "Rebalance"
    if reason == UNHEALTHY:
        return "Repair" if _initialized(node) else None
    if reason == EXPIRED:
        return "Expiration"
    return ACTION_OF_REASON.get(reason)


def expiration_deferred(node: Json) -> bool:
    return bool((node["metadata"].get("annotations") or {}).get(EXPIRATION_DEFERRED_ANNOTATION))


def claims_budgets(reason: str, node: Json) -> bool:
    """Whether taking `node` down for `reason` must fit its NodeDisruptionBudgets (a claim, else wait
    or refuse): voluntary reasons, repair (karpflow's choice: Karpenter's RFC #3192 proposes budgets
    for repair, its code has none), an expiration a window deferred, and `kubectl delete node`. The
    forceful rest (interruption, NodePool deletion, expiration as Karpenter v1 does it) is never
    stopped by a budget; it counts once it taints."""
    if reason in VOLUNTARY_REASONS or reason in (UNHEALTHY, MANUAL):
        return True
    return reason == EXPIRED and expiration_deferred(node)


def check_repair(node: Json, reason: str) -> None:
    """`karpenter.sh/do-not-repair` (karpflow's own) on an initialized node refuses its repair."""
    annotations = node["metadata"].get("annotations") or {}
    if reason == UNHEALTHY and _initialized(node) and annotations.get(DO_NOT_REPAIR_ANNOTATION) == "true":
        raise Refused(f"node {node['metadata']['name']} is annotated {DO_NOT_REPAIR_ANNOTATION}: no repair")


async def windows(kube: KubeApi, reads: ClusterReads | None = None) -> list[Window]:
    """The MaintenanceWindows as the planner applies them (broken ones fail closed); with `reads`, as
    the worker's cache holds them (a termination gate polled for hours), else from the API server."""
    if reads is None:
        listed = await kube.list_cluster_custom(KARPFLOW_GROUP, KARPFLOW_VERSION, WINDOWS_PLURAL)
    else:
        listed = await reads.cluster_custom(
            "MaintenanceWindow", KARPFLOW_GROUP, KARPFLOW_VERSION, WINDOWS_PLURAL
        )
    return [read_window(raw) for raw in listed]


def window_refusal(
    found: list[Window], nodes: list[Json], reason: str, command_id: str, now: datetime
) -> str | None:
    """Why a window forbids the action on one of `nodes` now (None: every matching window allows it)."""
    for node in nodes:
        action = window_action(reason, command_id, node)
        if action is None:
            continue
        block = blocked(found, action, node["metadata"].get("labels") or {}, now)
        if block is not None:
            return f"node {node['metadata']['name']}: {block.message()}"
    return None


def no_longer_empty(node: Json, pods: list[Json]) -> str | None:
    """Why an emptiness candidate is not empty any more (None: it still is). Pods may land between the
    planner's validation and the taint; an emptiness command has no replacement for them, so such a
    node is left out of the command, which goes on with the candidates still empty (Karpenter's
    emptiness validator keeps that subset too). Empty is the planner's rule, read on the pods as
    they are now: no reschedulable pod with a positive eviction cost (`eviction_cost_above_empty`)."""
    return eviction_cost_above_empty(node, [Pod(raw) for raw in pods])


def eviction_cost_above_empty(node: Json, pods: list[Pod]) -> str | None:
    """Karpenter's `Candidate.IsEmpty` on the node's pods now (kube/eviction_cost.py): the moving pods'
    eviction costs, negatives as 0, may add nothing to the node's own 1.0. Pods whose cost is not
    positive (a very negative pod-deletion-cost or priority) leave it empty: its drain evicts them."""
    moving = [pod for pod in pods if pod.reschedulable]
    costly = [pod for pod in moving if pod.eviction_cost > 0]
    if not costly:
        return None
    cost = reschedule_disruption_cost(pod.eviction_cost for pod in moving)
    return (
        f"node {node['metadata']['name']} is no longer empty: pod {costly[0].key} runs on it "
        f"(eviction cost {cost:.2f}, above {PER_NODE_BASE_DISRUPTION_COST:.1f} for an empty node)"
    )


def _ready(node: Json) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or ()
    )


def disruption_taints(node: Json) -> list[str]:
    """The disruption taint keys on the node (Karpenter's, karpflow's own, or both)."""
    keys = {t.get("key") for t in (node.get("spec") or {}).get("taints") or ()}
    return [key for key in DISRUPTION_TAINT_KEYS if key in keys]


def other_holder(node: Json, command_id: str, taint_key: str = DISRUPTED_TAINT_KEY) -> str | None:
    """Who else holds the node: another command, or another controller (a disruption taint without our
    annotation). `taint_key` is the key karpflow writes in its mode: beside Karpenter
    (`karpflow.dev/disrupted`), a `karpenter.sh/disrupted` taint is Karpenter's whatever the
    annotation says. None when untainted or held by `command_id`."""
    present = disruption_taints(node)
    if not present:
        return None
    if taint_key == KARPFLOW_DISRUPTED_TAINT_KEY and DISRUPTED_TAINT_KEY in present:
        return f"Karpenter ({DISRUPTED_TAINT_KEY})"
    owner = (node["metadata"].get("annotations") or {}).get(OWNER_ANNOTATION)
    if owner == command_id:
        return None
    return f"command {owner}" if owner else f"another controller ({present[0]} without an owner)"
