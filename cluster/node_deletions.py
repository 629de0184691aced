"""The node-deletion watcher: `kubectl delete node X` starts `termination/X` within moments.

A task inside every worker process, not a workflow. Why this is durable anyway: the durable record
of "this node must be terminated" is in Kubernetes itself, a deletionTimestamp held open by the
`karpenter.sh/termination` finalizer, and it stays there until TerminationWorkflow removes the
finalizer. The watcher only has to notice it, which it does by listing every node when it starts
(and after any watch error or every `resync` seconds) and then watching; nothing is lost while no
worker runs. Starting is idempotent by workflow id (`termination/<node>`, conflict policy
USE_EXISTING): several worker replicas, a disruption that already started the termination, or a
restart all end up with one workflow per node. A singleton workflow with a long-running watching
activity would add a heartbeat, a restart delay of one heartbeat timeout and a continue-as-new
cycle, and buy nothing the finalizer does not already give.

A node is started at most once per uid per process: a termination that failed (say, an instance
this cluster does not own) is not restarted in a loop; restarting the worker retries it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy

from api.constants import TERMINATION_FINALIZER
from api.workflow_ids import termination_workflow_id
from api.workflow_io import TerminationInput
from kube.client import NODES, Json, KubeApi

log = logging.getLogger(__name__)


def needs_termination(node: Json) -> bool:
    meta = node.get("metadata") or {}
    return bool(meta.get("deletionTimestamp")) and TERMINATION_FINALIZER in (meta.get("finalizers") or ())


class NodeDeletionWatcher:
    def __init__(
        self,
        kube: KubeApi,
        client: Client,
        task_queue: str,
        resync_seconds: float = 300.0,
        on_synced: Callable[[], None] = lambda: None,
    ) -> None:
        self.kube = kube
        self.client = client
        self.task_queue = task_queue
        self.resync = max(1, int(resync_seconds))
        self.on_synced = on_synced
        self.started: set[str] = set()
        self.synced = False

    async def run(self) -> None:
        """Forever: list, handle every node, watch from the list's resourceVersion; again on any end."""
        backoff = 0.5
        while True:
            try:
                listing = await self.kube.list_nodes()
                for node in listing.get("items") or ():
                    await self._consider(node)
                self.synced = True
                self.on_synced()
                backoff = 0.5
                version = (listing.get("metadata") or {}).get("resourceVersion") or "0"
                async for event in self.kube.watch(NODES, version, self.resync):
                    kind = event.get("type")
                    if kind == "ERROR":  # e.g. 410 Gone: the version is too old; list again
                        break
                    node = event.get("object") or {}
                    if kind == "DELETED":
                        self.started.discard((node.get("metadata") or {}).get("uid", ""))
                    elif kind in ("ADDED", "MODIFIED"):
                        await self._consider(node)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                self.synced = False
                log.warning("node-deletion watcher: %r; listing again in %.1fs", err, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    async def _consider(self, node: Json) -> None:
        if not needs_termination(node):
            return
        meta = node["metadata"]
        uid = meta.get("uid") or meta["name"]
        if uid in self.started:
            return
        name = meta["name"]
        handle = await self.client.start_workflow(
            "TerminationWorkflow",
            TerminationInput(
                node=name, reason="Manual", provider_id=(node.get("spec") or {}).get("providerID")
            ),
            id=termination_workflow_id(name),
            task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        self.started.add(uid)
        log.info(
            "node %s is being deleted: its termination is %s (run %s)",
            name,
            handle.id,
            handle.result_run_id,
        )
