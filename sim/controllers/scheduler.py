"""The simulated kube-scheduler: binds Pending pods to nodes through the pods/binding subresource.

It runs kube-scheduler's default profile wherever that decides a placement (kubernetes/kubernetes
v1.33-v1.35; pkg/scheduler/apis/config/v1/default_plugins.go, the plugins under
pkg/scheduler/framework/plugins/): filters NodeUnschedulable, TaintToleration, NodeAffinity,
NodePorts, NodeResourcesFit (sim/controllers/predicates.py), PodTopologySpread and InterPodAffinity
(sim/controllers/scheduling/), then scores NodeResourcesFit LeastAllocated, BalancedAllocation,
TaintToleration, NodeAffinity, PodTopologySpread (ScheduleAnyway, with the system default
constraints for the pods of a ReplicaSet, StatefulSet or Service) and InterPodAffinity, with the
default weights. The best score wins, the lowest node name among equals (kube-scheduler picks one of
them at random), so a run is deterministic.

Left out, because the simulator has nothing they act on: VolumeBinding, VolumeZone, VolumeRestrictions
and NodeVolumeLimits (the emulator serves no PersistentVolumes or claims), ImageLocality (nodes
report no images: it scores every node alike), DynamicResources, and preemption (a pod that fits
nowhere waits; its message has no "preemption: ..." part). kube-scheduler also scores only a sample
of the feasible nodes on large clusters (percentageOfNodesToScore); this scores them all.

Queue: pods by priority, then kept together by scheduling signature (everything that decides their
placement: a ReplicaSet's pods share one), oldest first; each group is evaluated once per pass and
kept current as pods bind (sim/controllers/scheduling/group.py). A bind is assumed at once, as
kube-scheduler assumes it, and the informer confirms it later.

Pods that fit nowhere stay Pending with `PodScheduled=False, reason=Unschedulable` and kube-scheduler's
message ("0/3 nodes are available: 1 node(s) didn't match pod anti-affinity rules, 2 Insufficient
cpu."), rewritten when it changes; they are tried again when a node or a counted pod changes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from planner.resources import Resources
from sim.apiserver.errors import ApiError, Conflict, NotFound
from sim.apiserver.store import Store
from sim.controllers.informer import Informer, Key, key_of
from sim.controllers.node_objects import now_rfc3339
from sim.controllers.predicates import (
    host_ports,
    node_allocatable,
    node_ready,
    pod_is_terminal,
    pod_nonzero_requests,
    pod_requests,
)
from sim.controllers.scheduling.cache import PodCache, PodInfo
from sim.controllers.scheduling.context import Lookups, PassContext
from sim.controllers.scheduling.group import Group
from sim.controllers.scheduling.snapshot import PassNodes
from sim.controllers.scheduling.terms import PodTerms, TermError, pod_terms

log = logging.getLogger(__name__)

SCHEDULER_NAME = "default-scheduler"
YIELD_EVERY = 200  # binds between yields to the loop, so the emulator's HTTP server stays responsive
# What the scheduler reads from the informer: namespaces (namespaceSelector), Services and
# ReplicaSets (the default spread selector), besides nodes and pods.
RESOURCES = ("nodes", "pods", "namespaces", "services", "replicasets")
_CONTROLLER_PLURALS = {"ReplicaSet": "replicasets", "ReplicationController": "replicationcontrollers"}


def _is_pending(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    return (
        not spec.get("nodeName")
        and not pod["metadata"].get("deletionTimestamp")
        and (spec.get("schedulerName") or SCHEDULER_NAME) == SCHEDULER_NAME
        and not spec.get("schedulingGates")
        and not pod_is_terminal(pod)
    )


def _unschedulable_message(pod: Mapping[str, Any]) -> str | None:
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "PodScheduled":
            if cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
                return str(cond.get("message") or "")
            return None
    return None


def _signature(pod: Mapping[str, Any], info: PodInfo) -> bytes:
    """Everything the default profile decides a placement by; pods with equal ones are placed alike."""
    spec, meta = pod.get("spec") or {}, pod["metadata"]
    owner = next((r for r in meta.get("ownerReferences") or () if r.get("controller")), None)
    parts = {
        "r": repr(info.requests),
        "z": info.nonzero,
        "n": info.namespace,
        "l": info.labels,
        "o": [owner.get("apiVersion"), owner.get("kind"), owner.get("name")] if owner else None,
        "s": spec.get("nodeSelector"),
        "a": spec.get("affinity"),
        "t": spec.get("tolerations"),
        "c": spec.get("topologySpreadConstraints"),
        "p": [list(port) for port in info.ports],
    }
    return orjson.dumps(parts, option=orjson.OPT_SORT_KEYS)


def _node_fingerprint(node: Mapping[str, Any]) -> bytes:
    """What of a node the scheduler decides by (a heartbeat changes none of it)."""
    meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    return orjson.dumps(
        [
            meta.get("labels"),
            spec.get("taints"),
            spec.get("unschedulable"),
            status.get("allocatable") or status.get("capacity"),
            node_ready(node),
        ],
        option=orjson.OPT_SORT_KEYS,
    )


class Scheduler:
    name = "scheduler"

    def __init__(self, store: Store, informer: Informer) -> None:
        self.store = store
        self.informer = informer
        self.cache = PodCache()
        self.nodes: dict[str, tuple[dict[str, Any], Resources]] = {}
        self._fingerprints: dict[str, bytes] = {}
        self.pending: set[Key] = set()
        self.wake = asyncio.Event()
        self.bound = 0
        self._pass: PassNodes | None = None
        self._parsed_terms: dict[tuple[str, bytes, bytes], PodTerms | None] = {}
        self.lookups = Lookups(
            namespaces=self._namespaces,
            namespace_labels=self._namespace_labels,
            services=self._services,
            controller=self._controller,
        )
        informer.add_handler(self._on_event)

    @property
    def pods(self) -> dict[Key, PodInfo]:
        return self.cache.pods

    @property
    def used(self) -> dict[str, Resources]:
        return self.cache.used

    # --- the informer's other kinds -----------------------------------------------------------------

    def _cached(self, plural: str) -> dict[Key, dict[str, Any]]:
        return self.informer.objects.get(plural) or {}

    def _namespaces(self) -> Iterable[tuple[str, Mapping[str, str]]]:
        for ns in self._cached("namespaces").values():
            meta = ns.get("metadata") or {}
            yield str(meta.get("name") or ""), meta.get("labels") or {}

    def _namespace_labels(self, name: str) -> Mapping[str, str]:
        ns = self._cached("namespaces").get(("", name)) or {}
        labels: Mapping[str, str] = (ns.get("metadata") or {}).get("labels") or {}
        return labels

    def _services(self, namespace: str) -> list[Mapping[str, Any]]:
        return [s for (ns, _), s in self._cached("services").items() if ns == namespace]

    def _controller(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        plural = _CONTROLLER_PLURALS.get(kind)
        return self._cached(plural).get((namespace, name)) if plural else None

    # --- cache ------------------------------------------------------------------------------------

    def _on_event(
        self, plural: str, kind: str, new: dict[str, Any] | None, old: dict[str, Any] | None
    ) -> None:
        if plural == "pods":
            self._on_pod(new, old)
        elif plural == "nodes":
            self._on_node(new, old)

    def _info(self, pod: dict[str, Any], before: PodInfo | None) -> PodInfo:
        spec, meta = pod.get("spec") or {}, pod["metadata"]
        key = key_of(pod)
        labels = dict(meta.get("labels") or {})
        if before is not None:
            # The pod spec is immutable (but for its nodeName): what it requests is known already.
            requests, nonzero, ports = before.requests, before.nonzero, before.ports
            terms = before.terms if before.labels == labels else self._terms(key, labels, spec)
        else:
            requests, nonzero, ports = pod_requests(spec), pod_nonzero_requests(spec), host_ports(spec)
            terms = self._terms(key, labels, spec)
        node = spec.get("nodeName") or ""
        pending = _is_pending(pod)
        info = PodInfo(
            key=key,
            labels=labels,
            node=node,
            requests=requests,
            nonzero=nonzero,
            counts=bool(node) and not pod_is_terminal(pod),
            terminating=bool(meta.get("deletionTimestamp")),
            pending=pending,
            terms=terms,
            ports=ports,
            order=(-int(spec.get("priority") or 0), meta.get("creationTimestamp") or "", key),
            unschedulable_message=_unschedulable_message(pod),
        )
        if pending:
            info.signature = (
                before.signature if before is not None and before.pending and before.labels == labels else b""
            ) or _signature(pod, info)
        return info

    def _terms(self, key: Key, labels: Mapping[str, str], spec: Mapping[str, Any]) -> PodTerms | None:
        """The pod's parsed inter-pod (anti-)affinity, one object for equal ones (the cache counts
        pods by terms: a workload's replicas share theirs)."""
        affinity = spec.get("affinity") or {}
        if affinity.get("podAffinity") is None and affinity.get("podAntiAffinity") is None:
            return None
        raw = orjson.dumps(
            [affinity.get("podAffinity"), affinity.get("podAntiAffinity")], option=orjson.OPT_SORT_KEYS
        )
        # matchLabelKeys take values from the pod's labels: then they are part of what is equal.
        own = orjson.dumps(labels, option=orjson.OPT_SORT_KEYS) if b"LabelKeys" in raw else b""
        memo = (key[0], raw, own)
        if memo not in self._parsed_terms:
            try:
                self._parsed_terms[memo] = pod_terms(key[0], labels, spec)
            except TermError:
                self._parsed_terms[memo] = None  # a pending pod's group reports it
        return self._parsed_terms[memo]

    def _on_pod(self, new: dict[str, Any] | None, old: dict[str, Any] | None) -> None:
        obj = new or old
        assert obj is not None
        key = key_of(obj)
        before = self.cache.pods.get(key)
        if new is None:
            self.cache.replace(before, None)
            self.pending.discard(key)
            if before is not None and before.counts and self.pending:
                self.wake.set()  # room freed up, a spread domain or an anti-affinity changed
            return
        info = self._info(new, before)
        self.cache.replace(before, info)
        if info.pending:
            if key not in self.pending:
                self.pending.add(key)
                self.wake.set()
        else:
            self.pending.discard(key)
            counted_before = before is not None and before.counts
            if self.pending and (counted_before != info.counts or (info.counts and before is None)):
                self.wake.set()

    def _on_node(self, new: dict[str, Any] | None, old: dict[str, Any] | None) -> None:
        if new is None:
            assert old is not None
            name = old["metadata"]["name"]
            self.nodes.pop(name, None)
            self._fingerprints.pop(name, None)
            if self._pass is not None:
                self._pass.exclude(name)
            return
        name = new["metadata"]["name"]
        fingerprint = _node_fingerprint(new)
        changed = self._fingerprints.get(name) != fingerprint
        self.nodes[name] = (new, node_allocatable(new))
        self._fingerprints[name] = fingerprint
        if not changed:
            return
        if self._pass is not None:
            self._pass.exclude(name)  # decided on its old self: left out until the next pass
        if self.pending:
            self.wake.set()

    # --- scheduling -------------------------------------------------------------------------------

    def _queue_order(self) -> list[Key]:
        """Priority first; within a priority, pods of one signature together (the group whose oldest
        pod is oldest first), oldest first inside a group."""
        pods = self.cache.pods
        by_age = sorted(self.pending, key=lambda k: pods[k].order)
        first_seen: dict[tuple[int, bytes], int] = {}
        for index, key in enumerate(by_age):
            info = pods[key]
            first_seen.setdefault((info.order[0], info.signature), index)
        return sorted(
            by_age,
            key=lambda k: (pods[k].order[0], first_seen[(pods[k].order[0], pods[k].signature)]),
        )

    async def schedule_pass(self) -> int:
        """Try every pending pod once; returns how many were bound."""
        self.informer.sync()
        if not self.pending:
            return 0
        order = self._queue_order()
        nodes = self._pass = PassNodes(self.nodes, self.cache)
        self.cache.changes = []
        ctx = PassContext(nodes, self.cache, self.lookups)
        groups: dict[bytes, Group] = {}
        failed: list[tuple[Key, str]] = []
        bound = 0
        try:
            for key in order:
                info = self.cache.pods.get(key)
                if info is None or not info.pending:
                    continue
                group = groups.get(info.signature)
                if group is None:
                    pod = self.informer.get("pods", key[1], key[0])
                    if pod is None:
                        continue
                    group = groups[info.signature] = Group(ctx, info, pod)
                target = group.choose()
                if target is None:
                    failed.append((key, group.diagnose()))
                    continue
                name = nodes.names[target]
                try:
                    self.store.bind(key[0], key[1], name)
                except (Conflict, NotFound):
                    continue  # deleted or bound meanwhile: the informer will tell
                self.pending.discard(key)
                self.cache.assume(info, name)
                bound += 1
                self.bound += 1
                if bound % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
        finally:
            self.cache.changes = None
            self._pass = None
        if not nodes.excluded:
            # A node that changed during the pass woke the next one, which decides afresh.
            self._mark_unschedulable(failed)
        if bound and failed:
            # kube-scheduler retries an unschedulable pod when a pod is assigned (a spread domain,
            # an affinity target): these binds may be what the failed ones wait for.
            self.wake.set()
        return bound

    def _mark_unschedulable(self, failed: list[tuple[Key, str]]) -> None:
        at = now_rfc3339()
        for key, message in failed:
            info = self.cache.pods.get(key)
            if info is None or not info.pending or info.unschedulable_message == message:
                continue

            def mark(pod: dict[str, Any], message: str = message) -> None:
                status = pod.setdefault("status", {})
                conditions = list(status.get("conditions") or ())
                previous = next((c for c in conditions if c.get("type") == "PodScheduled"), None)
                since = (
                    previous.get("lastTransitionTime")
                    if previous and previous.get("status") == "False"
                    else None
                )
                conditions = [c for c in conditions if c.get("type") != "PodScheduled"]
                conditions.append(
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": message,
                        "lastProbeTime": None,
                        "lastTransitionTime": since or at,
                    }
                )
                status["conditions"] = conditions

            try:
                self.store.mutate("pods", key[1], mark, key[0], subresource="status")
                info.unschedulable_message = message
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
