"""The part of every simulated kubelet that starts pods: a pod bound to a Ready node becomes Running
and Ready after a delay (conditions, startTime, IPs, one running containerStatus per container).

Pods on a node that is not Ready wait (the kubelet is not up yet, or never will be). A pod on a node
that goes NotReady later keeps running here until the taint manager deletes it (taint_eviction.py,
after its not-ready/unreachable tolerationSeconds); pods of a deleted Node are removed by the pod GC
(`podgc.py`). Graceful deletion is the store's business.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

from sim.apiserver.errors import ApiError
from sim.apiserver.store import Store
from sim.controllers.informer import Informer
from sim.controllers.node_objects import now_rfc3339
from sim.controllers.predicates import node_ready
from sim.controllers.timers import Timers
from sim.timescale import TimeScale

log = logging.getLogger(__name__)


def _node_ip(node: dict[str, Any] | None) -> str:
    for address in ((node or {}).get("status") or {}).get("addresses") or ():
        if address.get("type") == "InternalIP":
            return address.get("address", "")
    return ""


def _startable(pod: dict[str, Any]) -> bool:
    return (
        bool((pod.get("spec") or {}).get("nodeName"))
        and not pod["metadata"].get("deletionTimestamp")
        and (pod.get("status") or {}).get("phase", "Pending") == "Pending"
    )


class Kubelets:
    name = "kubelet"

    def __init__(
        self, store: Store, informer: Informer, timescale: TimeScale, start_seconds: float = 2.0
    ) -> None:
        self.store = store
        self.informer = informer
        self.scale = timescale
        self.start_seconds = start_seconds
        self.timers = Timers()
        self._starting: set[str] = set()  # pod uids with a start timer
        self._ips = itertools.count(1)
        self.started = 0
        informer.add_handler(self._on_event)

    def _on_event(
        self, plural: str, kind: str, new: dict[str, Any] | None, old: dict[str, Any] | None
    ) -> None:
        if new is None:
            return
        if plural == "pods":
            if _startable(new):
                node = self.informer.get("nodes", new["spec"]["nodeName"])
                if node is not None and node_ready(node):
                    self._schedule_start(new)
        elif plural == "nodes" and node_ready(new) and not (old is not None and node_ready(old)):
            # Newly Ready: start what was bound to it while it booted.
            for pod in self.store.pods_on_node(new["metadata"]["name"]):
                if _startable(pod):
                    self._schedule_start(pod)

    def _schedule_start(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        if uid in self._starting:
            return
        self._starting.add(uid)
        ns, name, node = (
            pod["metadata"].get("namespace", ""),
            pod["metadata"]["name"],
            pod["spec"]["nodeName"],
        )
        self.timers.after(
            self.scale.seconds(self.start_seconds),
            lambda: self._start(ns, name, uid, node),
            f"start pod {ns}/{name}",
        )

    def _next_ip(self) -> str:
        n = next(self._ips)
        return f"100.64.{(n >> 8) & 255}.{n & 255}"

    def _start(self, ns: str, name: str, uid: str, node_name: str) -> None:
        self._starting.discard(uid)
        node = self.informer.get("nodes", node_name)
        at = now_rfc3339()
        pod_ip = self._next_ip()
        host_ip = _node_ip(node)
        started = False

        def run(pod: dict[str, Any]) -> dict[str, Any] | None:
            nonlocal started
            meta, spec = pod["metadata"], pod.get("spec") or {}
            if meta.get("uid") != uid or spec.get("nodeName") != node_name or not _startable(pod):
                return pod  # replaced, rebound or deleting meanwhile: leave it (no change, no write)
            status = pod.setdefault("status", {})
            status.update(
                phase="Running",
                startTime=status.get("startTime") or at,
                hostIP=host_ip,
                hostIPs=[{"ip": host_ip}] if host_ip else [],
                podIP=pod_ip,
                podIPs=[{"ip": pod_ip}],
            )
            status["conditions"] = [
                {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": at}
                for kind in (
                    "PodReadyToStartContainers",
                    "Initialized",
                    "Ready",
                    "ContainersReady",
                    "PodScheduled",
                )
            ]
            status["containerStatuses"] = [
                {
                    "name": c.get("name", ""),
                    "image": c.get("image", ""),
                    "imageID": f"sim://{c.get('image', '')}",
                    "containerID": f"containerd://{uid[:8]}-{i}",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": at}},
                }
                for i, c in enumerate(spec.get("containers") or ())
            ]
            started = True
            return pod

        if node is None or not node_ready(node):
            return  # the node went away or NotReady before the pod started; a Ready event retries
        try:
            self.store.mutate("pods", name, run, ns, subresource="status")
        except ApiError as err:
            log.debug("pod %s/%s not started: %s", ns, name, err)
            return
        if started:
            self.started += 1

    async def run(self) -> None:
        self.informer.sync()
        for pod in list(self.informer.items("pods")):
            if _startable(pod):
                node = self.informer.get("nodes", pod["spec"]["nodeName"])
                if node is not None and node_ready(node):
                    self._schedule_start(pod)
        await asyncio.Event().wait()  # event driven from here on

    def stop(self) -> None:
        self.timers.cancel_all()
