"""The node lifecycle controller's NoExecute taints: a node whose Ready condition is False carries
`node.kubernetes.io/not-ready:NoExecute`, one whose Ready is Unknown (its kubelet went silent)
`node.kubernetes.io/unreachable:NoExecute`, and a Ready node neither. The two are mutually
exclusive, swapped in one write, and carry `timeAdded` (kubernetes/kubernetes
pkg/controller/nodelifecycle/node_lifecycle_controller.go: `doNoExecuteTaintingPass`,
`markNodeAsReachable`). The taint manager (taint_eviction.py) then deletes the pods that do not
tolerate them, after the pods' tolerationSeconds: 300 s for the tolerations every pod gets from the
DefaultTolerationSeconds admission plugin (api/constants.DEFAULT_POD_TOLERATIONS).

The NoSchedule twins of these taints, and the Ready condition itself, are written by the simulated
kubelets (nodes.py). Not reproduced: the per-zone eviction rate limits (`--node-eviction-rate`
0.1 node/s, and none at all in a zone mostly down): every node is tainted as soon as its condition
says so; a node without a Ready condition is left alone (the real controller marks it Unknown after
the grace period, the simulator never registers such a node).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from api.constants import NOT_READY_TAINT_KEY, UNREACHABLE_TAINT_KEY
from sim.apiserver.errors import NotFound
from sim.apiserver.store import Store
from sim.controllers.informer import Informer
from sim.controllers.node_objects import now_rfc3339
from sim.controllers.predicates import node_condition

log = logging.getLogger(__name__)

NO_EXECUTE = "NoExecute"
CONDITION_TAINT = {"False": NOT_READY_TAINT_KEY, "Unknown": UNREACHABLE_TAINT_KEY}
CONTROLLER_KEYS = frozenset(CONDITION_TAINT.values())


def wanted_taint(node: Mapping[str, Any]) -> str | None:
    """The NoExecute taint key the node's Ready condition calls for (None: neither)."""
    ready = node_condition(node, "Ready")
    return CONDITION_TAINT.get(ready) if ready is not None else None


def current_taints(node: Mapping[str, Any]) -> set[str]:
    return {
        str(t.get("key"))
        for t in (node.get("spec") or {}).get("taints") or ()
        if t.get("effect") == NO_EXECUTE and t.get("key") in CONTROLLER_KEYS
    }


def swapped(taints: list[dict[str, Any]], wanted: str | None, at: str) -> list[dict[str, Any]]:
    """`taints` with the controller's NoExecute taint swapped for `wanted` (SwapNodeControllerTaint);
    every other taint, and a taint already right, kept as it is."""
    kept = [
        t
        for t in taints
        if not (t.get("effect") == NO_EXECUTE and t.get("key") in CONTROLLER_KEYS and t.get("key") != wanted)
    ]
    if wanted is not None and not any(t.get("key") == wanted and t.get("effect") == NO_EXECUTE for t in kept):
        kept.append({"key": wanted, "effect": NO_EXECUTE, "timeAdded": at})
    return kept


class NoExecuteTaints:
    name = "noexecute"

    def __init__(self, store: Store, informer: Informer) -> None:
        self.store = store
        self.informer = informer
        self.pending: set[str] = set()
        self.writes = 0
        self._wake = asyncio.Event()
        informer.add_handler(self._on_event)

    def _on_event(
        self, plural: str, kind: str, new: dict[str, Any] | None, old: dict[str, Any] | None
    ) -> None:
        if plural != "nodes" or new is None:
            return
        wanted = wanted_taint(new)
        if current_taints(new) != ({wanted} if wanted else set()):
            self.pending.add(new["metadata"]["name"])
            self._wake.set()

    def reconcile(self, name: str) -> bool:
        """Swap the node's NoExecute taint for what its Ready condition says; True if written."""
        changed = False

        def swap(node: dict[str, Any]) -> None:
            nonlocal changed
            spec = node.setdefault("spec", {})
            taints = list(spec.get("taints") or [])
            new = swapped(taints, wanted_taint(node), now_rfc3339())
            if new != taints:  # unchanged, the store writes nothing
                spec["taints"] = new
                changed = True

        try:
            self.store.mutate("nodes", name, swap)
        except NotFound:
            return False
        self.writes += changed
        return changed

    async def run(self) -> None:
        self.informer.sync()
        for node in list(self.informer.items("nodes")):
            self._on_event("nodes", "ADDED", node, None)
        while True:
            await self._wake.wait()
            self._wake.clear()
            self.informer.sync()
            names, self.pending = self.pending, set()
            for name in sorted(names):
                self.reconcile(name)
