"""The taint manager: pods on a node with NoExecute taints they do not tolerate are deleted, at once
or when the shortest `tolerationSeconds` of the tolerations that let them stay runs out
(kubernetes/kubernetes pkg/controller/tainteviction/taint_eviction.go).

- For each pod bound to a node with NoExecute taints: every taint needs a matching toleration
  (`GetMatchingTolerations`, the first toleration that tolerates each taint); one taint without:
  the pod is deleted now. Otherwise the shortest tolerationSeconds of those tolerations decides
  (`getMinTolerationTime`: none set is forever, zero or less is now). An eviction already scheduled
  for the pod keeps its time; the taints going away, the pod leaving or being deleted cancels it.
- Deleting is what `addConditionAndDeletePod` does: the pod gets the condition
  `DisruptionTarget=True` (reason `DeletionByTaintManager`), then an ordinary DELETE with the pod's
  own grace period. Not an eviction: PodDisruptionBudgets do not hold it back.

The NoExecute taints come from noexecute_taints.py (not-ready, unreachable) or from anyone else
(`kubectl taint ... :NoExecute`). Every pod carries the 300 s not-ready/unreachable tolerations the
DefaultTolerationSeconds admission plugin adds; DaemonSet pods tolerate both without a limit.
Delays are simulated seconds (scaled by the TimeScale). Not reproduced: the TaintManagerEviction
Events, pods already terminating (deleting them again changes nothing but their grace).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sim.apiserver.errors import ApiError, NotFound
from sim.apiserver.store import Store
from sim.controllers.informer import Informer
from sim.controllers.node_objects import now_rfc3339
from sim.controllers.predicates import tolerates
from sim.controllers.timers import Timers
from sim.timescale import TimeScale

log = logging.getLogger(__name__)

PodKey = tuple[str, str]  # (namespace, name)
DISRUPTION_TARGET = {
    "type": "DisruptionTarget",
    "status": "True",
    "reason": "DeletionByTaintManager",
    "message": "Taint manager: deleting due to NoExecute taint",
}


def no_execute_taints(node: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    return [t for t in ((node or {}).get("spec") or {}).get("taints") or () if t.get("effect") == "NoExecute"]


def matching_tolerations(
    taints: Iterable[Mapping[str, Any]], tolerations: Iterable[Mapping[str, Any]] | None
) -> tuple[bool, list[Mapping[str, Any]]]:
    """`GetMatchingTolerations`: (every taint tolerated, the first toleration matching each)."""
    tols = list(tolerations or ())
    used: list[Mapping[str, Any]] = []
    for taint in taints:
        match = next((t for t in tols if tolerates(t, taint)), None)
        if match is None:
            return False, []
        used.append(match)
    return True, used


def min_toleration_seconds(used: Iterable[Mapping[str, Any]]) -> float | None:
    """`getMinTolerationTime`: the shortest tolerationSeconds; 0 for none used or any <= 0; None
    (forever) when no toleration used sets one."""
    used = list(used)
    if not used:
        return 0.0
    limits: list[float] = []
    for toleration in used:
        seconds = toleration.get("tolerationSeconds")
        if seconds is None:
            continue
        if float(seconds) <= 0:
            return 0.0
        limits.append(float(seconds))
    return min(limits) if limits else None


def pod_key(pod: Mapping[str, Any]) -> PodKey:
    meta = pod.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def with_condition(status: dict[str, Any], condition: Mapping[str, str], at: str) -> bool:
    """`UpdatePodCondition`: set the condition (a new transition time only if its status changes);
    False when it was already there as it is."""
    conditions = status.setdefault("conditions", [])
    for existing in conditions:
        if existing.get("type") == condition["type"]:
            if all(existing.get(k) == v for k, v in condition.items()):
                return False
            if existing.get("status") != condition["status"]:
                existing["lastTransitionTime"] = at
            existing.update(condition)
            return True
    conditions.append({**condition, "lastProbeTime": None, "lastTransitionTime": at})
    return True


@dataclass
class _Scheduled:
    uid: str
    created: float  # monotonic
    fire_at: float  # monotonic


class TaintEviction:
    name = "tainteviction"

    def __init__(self, store: Store, informer: Informer, timescale: TimeScale) -> None:
        self.store = store
        self.informer = informer
        self.scale = timescale
        self.timers = Timers()
        self.scheduled: dict[PodKey, _Scheduled] = {}
        self.deleted = 0
        self._tainted: dict[str, list[dict[str, Any]]] = {}  # node -> its NoExecute taints
        self._nodes: set[str] = set()
        self._pods: set[PodKey] = set()
        self._wake = asyncio.Event()
        informer.add_handler(self._on_event)

    # --- events: mark work, never write ----------------------------------------------------------

    def _on_event(
        self, plural: str, kind: str, new: dict[str, Any] | None, old: dict[str, Any] | None
    ) -> None:
        if plural == "nodes":
            if new is None or old is None or no_execute_taints(new) != no_execute_taints(old):
                self._nodes.add(str(((new or old) or {}).get("metadata", {}).get("name", "")))
                self._wake.set()
        elif plural == "pods":
            if new is None:
                if old is not None:
                    self.scheduled.pop(pod_key(old), None)  # deleted: nothing left to do
                return
            spec, before = new.get("spec") or {}, (old or {}).get("spec") or {}
            deleting = bool(new["metadata"].get("deletionTimestamp"))
            if (
                old is None
                or spec.get("nodeName") != before.get("nodeName")
                or spec.get("tolerations") != before.get("tolerations")
                or deleting != bool(old["metadata"].get("deletionTimestamp"))
            ):
                self._pods.add(pod_key(new))
                self._wake.set()

    # --- decisions ---------------------------------------------------------------------------------

    def _node_updated(self, name: str) -> None:
        taints = no_execute_taints(self.informer.get("nodes", name))
        if taints:
            self._tainted[name] = taints
        else:
            self._tainted.pop(name, None)
        for pod in self.store.pods_on_node(name):
            self._process(pod, taints)

    def _pod_updated(self, key: PodKey) -> None:
        pod = self.informer.get("pods", key[1], key[0])
        if pod is None:
            self.scheduled.pop(key, None)
            return
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            self.scheduled.pop(key, None)
            return
        self._process(pod, self._tainted.get(node, []))

    def _process(self, pod: dict[str, Any], taints: list[dict[str, Any]]) -> None:
        key, uid = pod_key(pod), pod["metadata"].get("uid", "")
        if not taints or pod["metadata"].get("deletionTimestamp"):
            self.scheduled.pop(key, None)
            return
        tolerated, used = matching_tolerations(taints, (pod.get("spec") or {}).get("tolerations"))
        if not tolerated:
            self._schedule(key, uid, 0.0)
            return
        seconds = min_toleration_seconds(used)
        if seconds is None:
            self.scheduled.pop(key, None)  # tolerated forever
            return
        existing = self.scheduled.get(key)
        if existing is not None and existing.uid == uid:
            return  # the eviction scheduled first keeps its time
        self._schedule(key, uid, seconds)

    def _schedule(self, key: PodKey, uid: str, seconds: float) -> None:
        now = time.monotonic()
        delay = self.scale.seconds(seconds)
        entry = _Scheduled(uid, now, now + delay)
        self.scheduled[key] = entry
        self.timers.after(delay, lambda: self._fire(key, entry), f"taint eviction of {key[0]}/{key[1]}")

    def _fire(self, key: PodKey, entry: _Scheduled) -> None:
        if self.scheduled.get(key) is not entry:
            return  # cancelled or rescheduled meanwhile
        del self.scheduled[key]
        at = now_rfc3339()

        node: list[str] = []

        def mark(pod: dict[str, Any]) -> None:
            if pod["metadata"].get("uid") == entry.uid:
                with_condition(pod.setdefault("status", {}), DISRUPTION_TARGET, at)
                node.append(str((pod.get("spec") or {}).get("nodeName") or "?"))

        namespace, name = key
        try:
            self.store.mutate("pods", name, mark, namespace, subresource="status")
            self.store.delete("pods", name, namespace, preconditions={"uid": entry.uid})
        except NotFound:
            return
        except ApiError as err:  # replaced by a pod of the same name meanwhile
            log.debug("taint manager left %s/%s: %s", namespace, name, err)
            return
        self.deleted += 1
        log.info(
            "taint manager deleted pod %s/%s of node %s (NoExecute taint)",
            namespace,
            name,
            node[0] if node else "?",
        )

    # --- loop -----------------------------------------------------------------------------------------

    async def run(self) -> None:
        self.informer.sync()
        for node in list(self.informer.items("nodes")):
            self._nodes.add(node["metadata"]["name"])
        self._wake.set()
        while True:
            await self._wake.wait()
            self._wake.clear()
            self.informer.sync()
            nodes, self._nodes = self._nodes, set()
            for name in sorted(nodes):  # node updates first, as the real workers take them
                self._node_updated(name)
            pods, self._pods = self._pods, set()
            for key in sorted(pods):
                self._pod_updated(key)

    def stop(self) -> None:
        self.timers.cancel_all()
        self.scheduled.clear()
