"""Pod garbage collection for deleted nodes, as kube-controller-manager's PodGC does: once a Node
object is gone, the pods bound to it are force-deleted (grace period 0). A Terminating node (held by
a finalizer) keeps its pods: only a node that no longer exists orphans them.

Deletions are driven by the node's DELETED event; a sweep every `sweep_seconds` (real time) also
removes pods bound to a node that was missing at two sweeps in a row (PodGC's quarantine), so
nothing is left behind if an event was missed or a pod was bound to a node that never existed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sim.apiserver.errors import ApiError, NotFound
from sim.apiserver.store import Store
from sim.controllers.informer import Informer

log = logging.getLogger(__name__)


class PodGC:
    name = "podgc"

    def __init__(self, store: Store, informer: Informer, sweep_seconds: float = 10.0) -> None:
        self.store = store
        self.informer = informer
        self.sweep_seconds = sweep_seconds
        self.deleted = 0
        self._gone: list[str] = []
        self._suspects: set[tuple[str, str, str]] = set()
        self.wake = asyncio.Event()
        informer.add_handler(self._on_event)

    def _on_event(
        self, plural: str, kind: str, new: dict[str, Any] | None, old: dict[str, Any] | None
    ) -> None:
        if plural == "nodes" and new is None and old is not None:
            self._gone.append(old["metadata"]["name"])
            self.wake.set()

    def _force_delete(self, pod: dict[str, Any]) -> int:
        meta = pod["metadata"]
        try:
            self.store.delete(
                "pods",
                meta["name"],
                meta.get("namespace"),
                grace_period_seconds=0,
                preconditions={"uid": meta["uid"]},
            )
        except NotFound:
            return 0
        except ApiError as err:  # e.g. replaced by a new pod of the same name meanwhile
            log.debug("pod GC skipped %s/%s: %s", meta.get("namespace"), meta["name"], err)
            return 0
        return 1

    def collect(self) -> int:
        self.informer.sync()
        count = 0
        while self._gone:
            node = self._gone.pop()
            if self.informer.get("nodes", node) is not None:
                continue  # re-created under the same name meanwhile
            for pod in self.store.pods_on_node(node):
                count += self._force_delete(pod)
        self.deleted += count
        return count

    def sweep(self) -> int:
        """Delete pods whose node was already missing at the previous sweep."""
        self.informer.sync()
        suspects: set[tuple[str, str, str]] = set()
        count = 0
        for pod in list(self.informer.items("pods")):
            node = (pod.get("spec") or {}).get("nodeName")
            if not node or self.informer.get("nodes", node) is not None:
                continue
            meta = pod["metadata"]
            ident = (meta.get("namespace", ""), meta["name"], meta["uid"])
            if ident in self._suspects:
                count += self._force_delete(pod)
            else:
                suspects.add(ident)
        self._suspects = suspects
        self.deleted += count
        return count

    async def run(self) -> None:
        async def sweeper() -> None:
            while True:
                await asyncio.sleep(self.sweep_seconds)
                if count := self.sweep():
                    log.info("pod GC deleted %d orphaned pod(s)", count)

        task = asyncio.create_task(sweeper())
        try:
            while True:
                await self.wake.wait()
                self.wake.clear()
                if count := self.collect():
                    log.info("pod GC deleted %d pod(s) of deleted nodes", count)
        finally:
            task.cancel()
