"""Pod garbage collection of the pods of gone nodes, as kube-controller-manager's PodGC does it
(kubernetes/kubernetes pkg/controller/podgc/gc_controller.go, `gcOrphaned`).

Every `period` (20 s, `gcCheckPeriod`) the controller looks for pods bound to a node its cache does
not have. Such a node is put in quarantine for 40 s (`quarantineTime`: the cache may be behind);
once the quarantine is over and the API server still says the Node does not exist, each of its pods
is marked `Failed` with the condition `DisruptionTarget=True` (reason `DeletionByPodGC`, "PodGC:
node no longer exists") and force-deleted (grace period 0, `markFailedAndDeletePodWithCondition`).
So the pods of a deleted node stay 40 to 60 s after it; a Terminating node (held by a finalizer)
keeps its pods: only a node that no longer exists orphans them.

Delays are simulated seconds (scaled by the TimeScale; the period has a real-time floor so a zero
scale does not spin). Not reproduced: the collection of terminated pods past
--terminated-pod-gc-threshold and of terminating pods on out-of-service nodes; unscheduled pods
being deleted are removed at once by the API server here (sim/apiserver/store.py), so that part
has nothing to do.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from sim.apiserver.errors import ApiError, NotFound
from sim.apiserver.store import Store
from sim.controllers.informer import Informer
from sim.controllers.node_objects import now_rfc3339
from sim.controllers.taint_eviction import with_condition
from sim.timescale import TimeScale

log = logging.getLogger(__name__)

GC_CHECK_PERIOD = 20.0  # gcCheckPeriod
QUARANTINE = 40.0  # quarantineTime
DISRUPTION_TARGET = {
    "type": "DisruptionTarget",
    "status": "True",
    "reason": "DeletionByPodGC",
    "message": "PodGC: node no longer exists",
}


class PodGC:
    name = "podgc"

    def __init__(
        self,
        store: Store,
        informer: Informer,
        timescale: TimeScale | None = None,
        *,
        period: float = GC_CHECK_PERIOD,
        quarantine: float = QUARANTINE,
        min_period_real: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.informer = informer
        self.scale = timescale or TimeScale(1.0)
        self.period = period
        self.quarantine = quarantine
        self.min_period_real = min_period_real
        self.clock = clock
        self.deleted = 0
        self.passes = 0
        self.quarantined: dict[str, float] = {}  # missing node -> when its quarantine ends (monotonic)
        # Bound pods by node, kept from the informer's events: a pass looks at nodes, not every pod.
        self._bound: dict[str, set[tuple[str, str]]] = {}
        informer.add_handler(self._on_event)

    def _on_event(
        self, plural: str, kind: str, new: dict[str, Any] | None, old: dict[str, Any] | None
    ) -> None:
        if plural != "pods":
            return
        before = ((old or {}).get("spec") or {}).get("nodeName")
        after = ((new or {}).get("spec") or {}).get("nodeName")
        if before == after and new is not None:
            return
        meta = (new or old or {}).get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        if before and (pods := self._bound.get(before)) is not None:
            pods.discard(key)
            if not pods:
                del self._bound[before]
        if after and new is not None:
            self._bound.setdefault(after, set()).add(key)

    def _orphans(self) -> dict[str, list[dict[str, Any]]]:
        """The pods bound to a node the cache does not have, by node."""
        out: dict[str, list[dict[str, Any]]] = {}
        for node, keys in self._bound.items():
            if self.informer.get("nodes", node) is not None:
                continue
            pods = [p for ns, name in keys if (p := self.informer.get("pods", name, ns)) is not None]
            if pods:
                out[node] = pods
        return out

    def gc(self) -> int:
        """One pass (`gcOrphaned`); returns how many pods it deleted."""
        self.informer.sync()
        now = self.clock()
        by_node = self._orphans()
        for node in by_node:
            self.quarantined.setdefault(node, now + self.scale.seconds(self.quarantine))
        count = 0
        for node, until in list(self.quarantined.items()):
            if node not in by_node:
                del self.quarantined[node]  # came back, or nothing of it is left
                continue
            if until > now:
                continue
            del self.quarantined[node]
            if self._node_exists(node):
                continue
            for pod in by_node[node]:
                count += self._mark_failed_and_delete(pod)
        self.deleted += count
        self.passes += 1
        return count

    def _node_exists(self, name: str) -> bool:
        """The GET a real PodGC makes after the quarantine: the cache alone may be behind."""
        try:
            self.store.get("nodes", name)
        except NotFound:
            return False
        return True

    def _mark_failed_and_delete(self, pod: dict[str, Any]) -> int:
        meta = pod["metadata"]
        uid, namespace, name = meta["uid"], meta.get("namespace"), meta["name"]
        at = now_rfc3339()

        def mark(current: dict[str, Any]) -> None:
            status = current.setdefault("status", {})
            if current["metadata"].get("uid") != uid or status.get("phase") in ("Succeeded", "Failed"):
                return
            status["phase"] = "Failed"
            with_condition(status, DISRUPTION_TARGET, at)

        try:
            self.store.mutate("pods", name, mark, namespace, subresource="status")
            self.store.delete("pods", name, namespace, grace_period_seconds=0, preconditions={"uid": uid})
        except NotFound:
            return 0
        except ApiError as err:  # e.g. replaced by a new pod of the same name meanwhile
            log.debug("pod GC skipped %s/%s: %s", namespace, name, err)
            return 0
        return 1

    async def run(self) -> None:
        while True:
            if count := self.gc():
                log.info("pod GC deleted %d pod(s) of deleted nodes", count)
            await asyncio.sleep(max(self.min_period_real, self.scale.seconds(self.period)))
