"""The part of every simulated kubelet that starts pods: a pod bound to a Ready node becomes Running
and Ready after a delay (conditions, startTime, IPs, one running containerStatus per container).

On a node booted from a crash-loop AMI (`karpflow sim faults bad-ami AMI --pods-crash`) every
container exits with code 1 as it starts: the pod is Running but not Ready, its containers wait in
CrashLoopBackOff and their restartCount grows, as the real kubelet's do (kubernetes/kubernetes):
- each new instance of a container counts one more than the last (pkg/kubelet/kuberuntime/
  kuberuntime_container.go `startContainer`: restartCount = the previous status's + 1, 0 for the
  first), and the one that ended is `lastState.terminated`;
- the first exit is restarted at once, since no back-off is recorded for the container yet; each
  later one waits the back-off, 10 s doubling up to 5 min (kuberuntime_manager.go `doBackOff`,
  pkg/kubelet/kubelet.go `backOffPeriod`, `MaxContainerBackOff`). So the count is 1 a moment after
  the pod starts, 2 after 10 s, 3 after 30 s, 4 after 70 s;
- a condition's lastTransitionTime moves only when its status does (pkg/kubelet/status/
  status_manager.go `updateLastTransitionTime`): Ready stays False since the pod first started.
Once the fault is lifted the next restart runs for good.

Pods on a node that is not Ready wait (the kubelet is not up yet, or never will be). A pod on a node
that goes NotReady later keeps running here until the taint manager deletes it (taint_eviction.py,
after its not-ready/unreachable tolerationSeconds); pods of a deleted Node are removed by the pod GC
(`podgc.py`). Graceful deletion is the store's business.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import Any

from sim.apiserver.errors import ApiError
from sim.apiserver.store import Store
from sim.controllers.informer import Informer
from sim.controllers.node_objects import now_rfc3339
from sim.controllers.predicates import node_ready
from sim.controllers.timers import Timers
from sim.timescale import TimeScale

log = logging.getLogger(__name__)
BACKOFF_SECONDS = 10.0  # the kubelet's first back-off before restarting a failed container
MAX_BACKOFF_SECONDS = 300.0


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


POD_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")


def pod_conditions(at: str, spec: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """A Running pod's conditions, all True; with `spec`, its containers not ready, in the kubelet's
    words (pkg/kubelet/status generate.go `GeneratePodReadyCondition`: reason ContainersNotReady)."""
    unready: dict[str, str] = {}
    if spec is not None:
        names = " ".join(c.get("name", "") for c in spec.get("containers") or ())
        unready = {"reason": "ContainersNotReady", "message": f"containers with unready status: [{names}]"}
    conditions: list[dict[str, Any]] = []
    for kind in POD_CONDITIONS:
        ready = not unready or kind not in ("Ready", "ContainersReady")
        condition = {"type": kind, "status": "True" if ready else "False", "lastProbeTime": None}
        conditions.append({**condition, "lastTransitionTime": at, **({} if ready else unready)})
    return conditions


def kept_transitions(
    previous: list[dict[str, Any]] | None, conditions: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """`conditions`, each keeping the lastTransitionTime it had when its status did not change."""
    before = {c.get("type"): c for c in previous or ()}
    for condition in conditions:
        old = before.get(condition["type"])
        if old is not None and old.get("status") == condition["status"] and old.get("lastTransitionTime"):
            condition["lastTransitionTime"] = old["lastTransitionTime"]
    return conditions


def backoff_seconds(restarts: int) -> float:
    """How long the kubelet waits before restarting a container that exited after `restarts`
    restarts: none after the first exit, then 10 s doubling up to 5 min."""
    return 0.0 if restarts < 1 else min(BACKOFF_SECONDS * 2 ** (restarts - 1), MAX_BACKOFF_SECONDS)


def crashed_container(
    container: dict[str, Any], index: int, uid: str, at: str, *, restarts: int, pod: str = ""
) -> dict[str, Any]:
    """A container that exited with code 1 after `restarts` restarts and waits for its back-off
    (CrashLoopBackOff); `pod` is the kubelet's name for the pod (name_namespace(uid))."""
    name = container.get("name", "")
    backoff = int(backoff_seconds(restarts))
    return {
        "name": name,
        "image": container.get("image", ""),
        "imageID": f"sim://{container.get('image', '')}",
        "containerID": f"containerd://{uid[:8]}-{index}-{restarts}",
        "ready": False,
        "started": False,
        "restartCount": restarts,
        "state": {
            "waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off {backoff}s restarting failed container={name} pod={pod}",
            }
        },
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": at, "finishedAt": at}},
    }


class Kubelets:
    name = "kubelet"

    def __init__(
        self,
        store: Store,
        informer: Informer,
        timescale: TimeScale,
        start_seconds: float = 2.0,
        *,
        crash_looping: Callable[[str], bool] | None = None,
    ) -> None:
        self.store = store
        self.crash_looping = crash_looping or (lambda node: False)
        self.restarts = 0
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
        crashing = self.crash_looping(node_name)

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
            status["conditions"] = kept_transitions(
                status.get("conditions"), pod_conditions(at, spec if crashing else None)
            )
            if crashing:
                # The first instance exited and was restarted at once (no back-off yet): that one
                # exited too, and the container now waits its first back-off with one restart.
                status["containerStatuses"] = [
                    crashed_container(c, i, uid, at, restarts=1, pod=f"{name}_{ns}({uid})")
                    for i, c in enumerate(spec.get("containers") or ())
                ]
                started = True
                return pod
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
            if crashing:
                self._schedule_restart(ns, name, uid, node_name, 1)

    def _schedule_restart(self, ns: str, name: str, uid: str, node_name: str, restarts: int) -> None:
        self.timers.after(
            self.scale.seconds(backoff_seconds(restarts)),
            lambda: self._restart(ns, name, uid, node_name, restarts + 1),
            f"restart pod {ns}/{name}",
        )

    def _restart(self, ns: str, name: str, uid: str, node_name: str, restarts: int) -> None:
        """The back-off has passed: the containers run again, and crash again unless the fault is gone."""
        crashing = self.crash_looping(node_name)
        at = now_rfc3339()
        changed = False

        def restart(pod: dict[str, Any]) -> dict[str, Any] | None:
            nonlocal changed
            meta, spec = pod["metadata"], pod.get("spec") or {}
            if meta.get("uid") != uid or spec.get("nodeName") != node_name or meta.get("deletionTimestamp"):
                return pod
            status = pod.setdefault("status", {})
            containers = spec.get("containers") or ()
            status["conditions"] = kept_transitions(
                status.get("conditions"), pod_conditions(at, spec if crashing else None)
            )
            described = f"{name}_{ns}({uid})"
            if crashing:
                status["containerStatuses"] = [
                    crashed_container(c, i, uid, at, restarts=restarts, pod=described)
                    for i, c in enumerate(containers)
                ]
            else:
                status["containerStatuses"] = [
                    {
                        **crashed_container(c, i, uid, at, restarts=restarts, pod=described),
                        "ready": True,
                        "started": True,
                        "state": {"running": {"startedAt": at}},
                    }
                    for i, c in enumerate(containers)
                ]
            changed = True
            return pod

        try:
            self.store.mutate("pods", name, restart, ns, subresource="status")
        except ApiError as err:
            log.debug("pod %s/%s not restarted: %s", ns, name, err)
            return
        if changed:
            self.restarts += 1
            if crashing:
                self._schedule_restart(ns, name, uid, node_name, restarts)

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
