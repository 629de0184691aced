"""PodDisruptionBudget status controller: keeps `status` current as kube's disruption controller does.

The arithmetic is the emulator's (`sim.apiserver.eviction.compute_pdb_status`), shared with the
Eviction API so budgets are computed once. Each status write is a read-modify-write under the store
lock (`store.mutate`), so a `disruptedPods` entry an eviction has just recorded is never lost. A
budget is recomputed when a pod it selects (before or after the change) or the budget itself
changes, and every `resync_seconds` (real time) so `disruptedPods` entries expire on time.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sim.apiserver.errors import NotFound
from sim.apiserver.eviction import compute_pdb_status, pdb_selects, scale_finder
from sim.apiserver.store import Store
from sim.controllers.informer import Informer, Key
from sim.controllers.workloads import _Controller

log = logging.getLogger(__name__)


def _replicas(obj: dict[str, Any] | None) -> Any:
    return None if obj is None else (obj.get("spec") or {}).get("replicas")


class PdbStatusController(_Controller):
    name = "pdb"

    def __init__(self, store: Store, informer: Informer, resync_seconds: float = 10.0) -> None:
        self.pods_by_ns: dict[str, dict[str, dict[str, Any]]] = {}
        self.pdbs_by_ns: dict[str, set[str]] = {}
        self.resync_seconds = resync_seconds
        self.writes = 0
        super().__init__(store, informer)
        # (uid, replicas) of the workload owning a pod's scale, from the informer cache.
        self._scale_of = scale_finder(informer.get)

    def _on_event(
        self, plural: str, kind: str, new: dict[str, Any] | None, old: dict[str, Any] | None
    ) -> None:
        obj = new or old
        assert obj is not None
        ns = obj["metadata"].get("namespace") or ""
        name = obj["metadata"]["name"]
        if plural == "poddisruptionbudgets":
            if new is None:
                self.pdbs_by_ns.get(ns, set()).discard(name)
                return
            self.pdbs_by_ns.setdefault(ns, set()).add(name)
            if old is None or new.get("spec") != old.get("spec"):
                self.mark((ns, name))
        elif plural == "pods":
            pods = self.pods_by_ns.setdefault(ns, {})
            if new is None:
                pods.pop(name, None)
            else:
                pods[name] = new
            for pdb_name in self.pdbs_by_ns.get(ns, ()):
                pdb = self.informer.get("poddisruptionbudgets", pdb_name, ns)
                if pdb is not None and any(p is not None and pdb_selects(pdb, p) for p in (new, old)):
                    self.mark((ns, pdb_name))
        elif plural in ("replicasets", "deployments") and _replicas(new) != _replicas(old):
            for pdb_name in self.pdbs_by_ns.get(ns, ()):
                self.mark((ns, pdb_name))  # expectedPods follows the workload's scale

    async def reconcile(self, key: Key) -> None:
        ns, name = key
        pods = list(self.pods_by_ns.get(ns, {}).values())
        changed = False

        def refresh(pdb: dict[str, Any]) -> dict[str, Any]:
            nonlocal changed
            status = compute_pdb_status(pdb, pods, self._scale_of)
            if status != pdb.get("status"):
                pdb["status"] = status
                changed = True
            return pdb

        try:
            self.store.mutate("poddisruptionbudgets", name, refresh, ns, subresource="status")
        except NotFound:
            return
        if changed:
            self.writes += 1

    async def run(self) -> None:
        self.informer.sync()

        async def resync() -> None:
            while True:
                await asyncio.sleep(self.resync_seconds)
                for ns, names in self.pdbs_by_ns.items():
                    for pdb_name in names:
                        self.mark((ns, pdb_name))

        ticker = asyncio.create_task(resync())
        try:
            await super().run()
        finally:
            ticker.cancel()
