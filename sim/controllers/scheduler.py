"""The simulated kube-scheduler: binds Pending pods to nodes through the pods/binding subresource.

Filters are in `predicates.py` (readiness, cordon, taints, nodeSelector, required node affinity,
resources). Scoring is kube-scheduler's default **LeastAllocated** (the mean free fraction of cpu and
memory after placing the pod), ties broken by node name, so a run is deterministic and pods spread
the way they do on a real cluster (which is what leaves nodes for consolidation to find). Nodes with
PreferNoSchedule taints the pod does not tolerate come after every other node that fits: the default
profile weighs TaintToleration three times LeastAllocated, enough to outrank any resource score.

Efficiency with many pending pods: pods are ordered by priority, then kept together by scheduling
signature (requests, selector, affinity, tolerations — a ReplicaSet's pods share one), oldest first.
A group evaluates the static predicates once per node per pass and keeps a max-heap of node scores.
Within a pass usage only grows, so scores only fall: a popped entry whose recomputed score is lower
is pushed back (lazy greedy), and a node too full for a group is dropped from that group's heap.
Usage is tracked from the informer and updated at bind time ("assume"), never re-summed.

Pods that fit nowhere stay Pending with `PodScheduled=False, reason=Unschedulable` and are retried
when a node or a bound pod changes.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from dataclasses import dataclass, field
from typing import Any

import orjson

from planner.resources import ZERO, Resources
from sim.apiserver.errors import ApiError, Conflict, NotFound
from sim.apiserver.store import Store
from sim.controllers.informer import Informer, Key, key_of
from sim.controllers.node_objects import now_rfc3339
from sim.controllers.predicates import (
    least_allocated_score,
    node_accepts,
    node_allocatable,
    pod_is_terminal,
    pod_requests,
    preferred_against,
)

log = logging.getLogger(__name__)

SCHEDULER_NAME = "default-scheduler"
# LeastAllocated lies in [0, 1]: one untolerated PreferNoSchedule taint outweighs any resource score.
_AVOID_WEIGHT = 10.0
YIELD_EVERY = 200  # binds between yields to the loop, so the emulator's HTTP server stays responsive


@dataclass(slots=True)
class _Pod:
    node: str
    requests: Resources
    counts: bool  # bound and not terminal: its requests count against the node
    pending: bool
    signature: bytes
    order: tuple[Any, ...]
    unschedulable_marked: bool


@dataclass(slots=True)
class _Node:
    obj: dict[str, Any]
    allocatable: Resources


@dataclass
class _Group:
    spec: dict[str, Any]
    requests: Resources
    heap: list[tuple[float, str]] = field(default_factory=list)
    static_fit: int = 0
    # node -> untolerated PreferNoSchedule taints (only nodes that have any)
    avoid: dict[str, int] = field(default_factory=dict)


def _signature(spec: dict[str, Any], requests: Resources) -> bytes:
    parts = {
        "r": repr(requests),
        "s": spec.get("nodeSelector"),
        "a": ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        ),
        "t": spec.get("tolerations"),
    }
    return orjson.dumps(parts, option=orjson.OPT_SORT_KEYS)


def _is_pending(pod: dict[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    return (
        not spec.get("nodeName")
        and not pod["metadata"].get("deletionTimestamp")
        and (spec.get("schedulerName") or SCHEDULER_NAME) == SCHEDULER_NAME
        and not spec.get("schedulingGates")
        and not pod_is_terminal(pod)
    )


def _unschedulable_marked(pod: dict[str, Any]) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "PodScheduled":
            return cond.get("status") == "False" and cond.get("reason") == "Unschedulable"
    return False


class Scheduler:
    name = "scheduler"

    def __init__(self, store: Store, informer: Informer) -> None:
        self.store = store
        self.informer = informer
        self.pods: dict[Key, _Pod] = {}
        self.nodes: dict[str, _Node] = {}
        self.used: dict[str, Resources] = {}
        self.pending: set[Key] = set()
        self.wake = asyncio.Event()
        self.bound = 0
        informer.add_handler(self._on_event)

    # --- cache ------------------------------------------------------------------------------------

    def _on_event(
        self, plural: str, kind: str, new: dict[str, Any] | None, old: dict[str, Any] | None
    ) -> None:
        if plural == "pods":
            self._on_pod(new, old)
        elif plural == "nodes":
            self._on_node(new, old)

    def _charge(self, node: str, requests: Resources, sign: int) -> None:
        current = self.used.get(node, ZERO)
        self.used[node] = current + requests if sign > 0 else current - requests

    def _on_pod(self, new: dict[str, Any] | None, old: dict[str, Any] | None) -> None:
        obj = new or old
        assert obj is not None
        key = key_of(obj)
        before = self.pods.pop(key, None)
        if before is not None and before.counts:
            self._charge(before.node, before.requests, -1)
        if new is None:
            self.pending.discard(key)
            if before is not None and before.counts and self.pending:
                self.wake.set()  # room freed up
            return
        spec = new.get("spec") or {}
        if before is not None and before.signature and not spec.get("nodeName"):
            requests, signature = before.requests, before.signature  # the pod spec is immutable
        else:
            requests = pod_requests(spec)
            signature = b""
        node = spec.get("nodeName") or ""
        terminal = pod_is_terminal(new)
        pending = _is_pending(new)
        if pending and not signature:
            signature = _signature(spec, requests)
        meta = new["metadata"]
        info = _Pod(
            node=node,
            requests=requests,
            counts=bool(node) and not terminal,
            pending=pending,
            signature=signature,
            order=(-int(spec.get("priority") or 0), meta.get("creationTimestamp") or "", key),
            unschedulable_marked=_unschedulable_marked(new),
        )
        self.pods[key] = info
        if info.counts:
            self._charge(node, requests, +1)
        if pending:
            if key not in self.pending:
                self.pending.add(key)
                self.wake.set()
        else:
            self.pending.discard(key)
            if before is not None and before.counts and not info.counts and self.pending:
                self.wake.set()

    def _on_node(self, new: dict[str, Any] | None, old: dict[str, Any] | None) -> None:
        if new is None:
            assert old is not None
            self.nodes.pop(old["metadata"]["name"], None)
            return
        self.nodes[new["metadata"]["name"]] = _Node(new, node_allocatable(new))
        if self.pending:
            self.wake.set()

    # --- scheduling -------------------------------------------------------------------------------

    def _score(self, name: str) -> float | None:
        node = self.nodes.get(name)
        if node is None:
            return None
        return least_allocated_score(node.allocatable, self.used.get(name, ZERO))

    @staticmethod
    def _rank(group: _Group, name: str, score: float) -> float:
        """Heap key, lowest first: untolerated PreferNoSchedule taints first, then LeastAllocated."""
        return group.avoid.get(name, 0) * _AVOID_WEIGHT - score

    def _build_group(self, key: Key) -> _Group:
        pod = self.informer.get("pods", key[1], key[0]) or {}
        spec = pod.get("spec") or {}
        info = self.pods[key]
        group = _Group(spec=spec, requests=info.requests)
        for name, node in self.nodes.items():
            if node_accepts(spec, node.obj):
                group.static_fit += 1
                avoid = preferred_against(spec, node.obj)
                if avoid:
                    group.avoid[name] = avoid
                score = self._score(name)
                if score is not None:
                    group.heap.append((self._rank(group, name, score), name))
        heapq.heapify(group.heap)
        return group

    def _choose(self, group: _Group) -> str | None:
        heap = group.heap
        while heap:
            stored, name = heap[0]
            node = self.nodes.get(name)
            if node is None:
                heapq.heappop(heap)
                continue
            used = self.used.get(name, ZERO)
            score = self._rank(group, name, least_allocated_score(node.allocatable, used))
            if score != stored:
                heapq.heapreplace(heap, (score, name))
                continue
            if not (used + group.requests).fits(node.allocatable):
                heapq.heappop(heap)  # usage only grows within a pass: it will not fit this group again
                continue
            return name
        return None

    def _queue_order(self) -> list[Key]:
        """Priority first; within a priority, pods of one signature together (the group whose oldest
        pod is oldest first), oldest first inside a group. Keeping a group's pods together keeps its
        heap exact, which spares re-scoring nodes that another group has just filled."""
        by_age = sorted(self.pending, key=lambda k: self.pods[k].order)
        first_seen: dict[tuple[int, bytes], int] = {}
        for index, key in enumerate(by_age):
            info = self.pods[key]
            first_seen.setdefault((info.order[0], info.signature), index)
        return sorted(
            by_age,
            key=lambda k: (
                self.pods[k].order[0],
                first_seen[(self.pods[k].order[0], self.pods[k].signature)],
            ),
        )

    async def schedule_pass(self) -> int:
        """Try every pending pod once; returns how many were bound."""
        self.informer.sync()
        if not self.pending:
            return 0
        order = self._queue_order()
        groups: dict[bytes, _Group] = {}
        unschedulable: list[tuple[Key, _Group]] = []
        bound = 0
        for key in order:
            info = self.pods.get(key)
            if info is None or not info.pending:
                continue
            group = groups.get(info.signature)
            if group is None:
                group = groups[info.signature] = self._build_group(key)
            target = self._choose(group)
            if target is None:
                unschedulable.append((key, group))
                continue
            try:
                self.store.bind(key[0], key[1], target)
            except (Conflict, NotFound):
                continue  # deleted or bound meanwhile: the informer will tell
            # Assume the binding at once (the informer confirms it later, at no extra cost).
            info.pending, info.node, info.counts = False, target, True
            self.pending.discard(key)
            self._charge(target, info.requests, +1)
            score = self._score(target)
            if score is not None and group.heap and group.heap[0][1] == target:
                heapq.heapreplace(group.heap, (self._rank(group, target, score), target))
            bound += 1
            if bound % YIELD_EVERY == 0:
                await asyncio.sleep(0)
        self.bound += bound
        self._mark_unschedulable(unschedulable)
        return bound

    def _mark_unschedulable(self, failed: list[tuple[Key, _Group]]) -> None:
        total = len(self.nodes)
        at = now_rfc3339()
        for key, group in failed:
            info = self.pods.get(key)
            if info is None or info.unschedulable_marked or not info.pending:
                continue
            blocked = total - group.static_fit
            message = (
                f"0/{total} nodes are available: {blocked} node(s) didn't match the pod's readiness, taint, "
                f"selector or affinity constraints, {group.static_fit} node(s) had insufficient resources."
            )

            def mark(pod: dict[str, Any], message: str = message) -> None:
                status = pod.setdefault("status", {})
                conditions = [c for c in status.get("conditions") or () if c.get("type") != "PodScheduled"]
                conditions.append(
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": message,
                        "lastProbeTime": None,
                        "lastTransitionTime": at,
                    }
                )
                status["conditions"] = conditions

            try:
                self.store.mutate("pods", key[1], mark, key[0], subresource="status")
                info.unschedulable_marked = True
            except ApiError:
                continue

    async def run(self) -> None:
        self.informer.sync()
        while True:
            await self.wake.wait()
            self.wake.clear()
            try:
                await self.schedule_pass()
            except Exception:
                log.exception("scheduling pass failed")
                await asyncio.sleep(0.1)
            await asyncio.sleep(0)
