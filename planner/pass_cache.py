"""What one controller pass can hand the next: per-node work on pods that did not change.

At 5,000 nodes and 100,000 pods, every pass walks every pod of every node several times (candidates'
costs and blocks, the simulator's used room and topology counts), although between two passes only a
few hundred pods change. The snapshot builder (planner/snapshot_builder.py) hands each pass the same
`Pod` object for a pod that did not change (a changed pod is a new `Pod`), so a node whose pod list
holds the same objects, in the same order, has the same per-node aggregates: they are kept here and
reused, and the rest is worked out again.

A `PassCache` is an explicit object: the owner of the informer cache (activities/planning.py) keeps
one and passes it to `plan`; the planner never keeps one of its own. A plan made with a cache equals
a plan made without (tests/unit/planner/test_pass_cache.py checks it over changing snapshots): an
entry is reused only when its inputs are the same objects, and what it holds is computed by the same
code either way. Entries are immutable and replaced whole, and a pass keeps only the nodes it saw,
so the cache holds no more than one snapshot's worth, and two passes on two threads only lose hits.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from operator import is_
from typing import TYPE_CHECKING

from api.constants import DO_NOT_DISRUPT_ANNOTATION, LEGACY_DO_NOT_EVICT_ANNOTATION
from kube.drain_rules import DISRUPTED_TAINT

if TYPE_CHECKING:
    from planner.scheduling.inputs import BoundPod
    from planner.scheduling.simulator import NodeMemo
    from planner.snapshot import Node, Pod


def same_pods(a: Sequence[Pod], b: Sequence[Pod]) -> bool:
    """The same Pod objects in the same order (a changed pod is a new object)."""
    return len(a) == len(b) and all(map(is_, a, b))


def holds(node: Node, pods: Sequence[Pod], source: object) -> bool:
    """Whether `node` holds these pods, which a node held when its `pods_source` was `source`: at
    once when it still is (the builder's list, `Node.pods_source`), else pod by pod. At 20,000 nodes
    the walk over every pod took 0.1 s of CPU, three times a pass."""
    if source is not None and source is node.pods_source and len(pods) == len(node.pods):
        return True
    return same_pods(pods, node.pods)


_GUARDS = frozenset({DO_NOT_DISRUPT_ANNOTATION, LEGACY_DO_NOT_EVICT_ANNOTATION})


class NodePods:
    """What the planner reads of one node's pods, for any pass whose node holds these pods."""

    __slots__ = ("evictable", "eviction_cost", "guarded", "last_event", "pods", "reschedulable", "source")

    def __init__(self, pods: Sequence[Pod], source: Sequence[Pod] | None = None) -> None:
        self.pods = tuple(pods)
        self.source = source  # the node's `pods_source` when these were its pods
        self.reschedulable = tuple(p for p in pods if p.is_reschedulable)
        # Karpenter's DisruptionCost before the lifetime factor, summed in the pods' order.
        self.eviction_cost = sum(p.eviction_cost for p in pods if not p.is_terminal)
        # The latest pod event of a non-DaemonSet pod: the first pod with the latest time.
        latest: datetime | None = None
        for pod in pods:
            if pod.owner_kind == "DaemonSet":
                continue
            event = pod.last_event_time
            if event is not None and (latest is None or event > latest):
                latest = event
        self.last_event = latest
        # Pods whose do-not-disrupt annotations may protect them (which ones do depends on the time).
        self.guarded = tuple(p for p in pods if not _GUARDS.isdisjoint(p.annotations))
        # Pods an eviction would really move, so PDBs matter for them: active, not mirror pods, not
        # tolerating the disrupted taint (those stay until the node goes).
        self.evictable = tuple(
            p for p in pods if p.is_active and not p.is_mirror and not p.tolerates(DISRUPTED_TAINT)
        )


class PassCache:
    """Per-node aggregates kept from one pass to the next (see the module's docstring)."""

    def __init__(self) -> None:
        self._node_pods: dict[str, NodePods] = {}
        self._seen_pods: dict[str, NodePods] = {}
        # node name -> what the scheduling simulation derived of its bound pods: the pods and their
        # simulator form (planner/scheduling/adapter.py), and what the simulator counted of them
        # (planner/scheduling/simulator.py).
        self.bound: dict[str, tuple[tuple[Pod, ...], tuple[BoundPod, ...], Sequence[Pod] | None]] = {}
        self.sim_nodes: dict[str, NodeMemo] = {}
        self.hits = 0
        self.misses = 0

    def node_pods(self, node: Node) -> NodePods:
        name = node.name
        known = self._seen_pods.get(name) or self._node_pods.get(name)
        if known is None or not holds(node, known.pods, known.source):
            known = NodePods(node.pods, node.pods_source)
            self.misses += 1
        else:
            self.hits += 1
        self._seen_pods[name] = known
        return known

    def end_pass(self) -> None:
        """Forget the nodes this pass did not look at (deleted nodes), so the cache holds one
        snapshot's worth."""
        if self._seen_pods:
            self._node_pods, self._seen_pods = self._seen_pods, {}


def node_pods(cache: PassCache | None, node: Node) -> NodePods:
    """The node's pod aggregates: from the cache when it has them for these very pods."""
    return cache.node_pods(node) if cache is not None else NodePods(node.pods)
