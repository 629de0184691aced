"""Pod garbage collection for deleted nodes, as kube-controller-manager's PodGC does: once a Node
object is gone, the pods bound to it are force-deleted (grace period 0). A Terminating node (held by
a finalizer) keeps its pods: only a node that no longer exists orphans them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sim.apiserver.errors import NotFound
from sim.apiserver.store import Store
from sim.controllers.informer import Informer

log = logging.getLogger(__name__)


class PodGC:
    name = "podgc"

    def __init__(self, store: Store, informer: Informer) -> None:
        self.store = store
        self.informer = informer
        self.deleted = 0
        self._gone: list[str] = []
        self.wake = asyncio.Event()
        informer.add_handler(self._on_event)

    def _on_event(
        self, plural: str, kind: str, new: dict[str, Any] | None, old: dict[str, Any] | None
    ) -> None:
        if plural == "nodes" and new is None and old is not None:
            self._gone.append(old["metadata"]["name"])
            self.wake.set()

    def collect(self) -> int:
        self.informer.sync()
        count = 0
        while self._gone:
            node = self._gone.pop()
            if self.informer.get("nodes", node) is not None:
                continue  # re-created under the same name meanwhile
            for pod in self.store.pods_on_node(node):
                meta = pod["metadata"]
                try:
                    self.store.delete("pods", meta["name"], meta.get("namespace"), grace_period_seconds=0)
                    count += 1
                except NotFound:
                    pass
        self.deleted += count
        return count

    async def run(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            if count := self.collect():
                log.info("pod GC deleted %d pod(s) of deleted nodes", count)
