"""The node-deletion watcher: `kubectl delete node X` starts X's termination within moments.

A task inside every worker process, not a workflow. Why this is durable anyway: the durable record
of "this node must be terminated" is in Kubernetes itself, a deletionTimestamp held open by the
`karpenter.sh/termination` finalizer, and it stays there until TerminationWorkflow removes the
finalizer. The watcher only has to notice it, which it does by listing every node when it starts
(in pages, as the informer does) and after a watch error, and watching in between: a watch the
server ends after `resync` seconds is opened again from the last version it brought (bookmarks
move it while nothing changes), so a quiet cluster costs no listing of its nodes; nothing is lost
while no worker runs. Starting is idempotent by workflow id (`termination/<cluster>/<node>/<uid>`, conflict
policy USE_EXISTING): several worker replicas, a disruption that already started the termination, or
a restart all end up with one workflow per node, and a node that reuses the name of one whose
termination still runs gets its own (the id carries the UID, and the workflow is pinned to it). A
singleton workflow with a long-running watching activity would add a heartbeat, a restart delay of
one heartbeat timeout and a continue-as-new cycle, and buy nothing the finalizer does not already
give.

A termination that failed, was cancelled or timed out while its node is still being deleted is
started again with backoff (30 s doubling to 10 min), checked every `retry_every` seconds; `waiting`
says, per node, why and until when it waits (logged too). A refusal is retried like any failure:
the node stays deleting until a person fixes the cause (e.g. restores the ownership tag) or removes
the finalizer.

That check costs O(terminations that closed), not O(terminations in flight): a big rollout keeps
hundreds of nodes deleting at once, and every worker replica runs a watcher. The nodes are the
watch's own last view of them (no GET per node), and only runs that visibility lists as closed
unfinished since the last check (less a margin for its lag), and those waiting for their retry, are
described. The first check after a start describes every node once: what closed before it is not
in the window. If visibility cannot answer, the check describes every node, as that first one does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import WorkflowIDConflictPolicy

from api import search_attributes as sa
from api.constants import NODEPOOL_LABEL, TERMINATION_FINALIZER
from api.workflow_ids import termination_workflow_id
from api.workflow_io import TerminationInput
from kube.client import NODES, Json, KubeApi

log = logging.getLogger(__name__)

LIST_PAGE = 500  # nodes per list page (client-go's pager default)
RETRY_FIRST = timedelta(seconds=30)
VISIBILITY_LAG = timedelta(seconds=60)  # a closed run may show in visibility this late
RETRY_MAX = timedelta(minutes=10)
# Closed without succeeding: the node is still held by the finalizer, so the termination must run again.
UNFINISHED = {
    WorkflowExecutionStatus.FAILED,
    WorkflowExecutionStatus.CANCELED,
    WorkflowExecutionStatus.TERMINATED,
    WorkflowExecutionStatus.TIMED_OUT,
}


def _key(node: Json) -> str:
    """What the watcher tracks a node by: its UID (its name only if it has none, as no real one does)."""
    meta = node.get("metadata") or {}
    return str(meta.get("uid") or meta.get("name") or "")


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
        retry_every: float = 10.0,
        retry_first: timedelta = RETRY_FIRST,
        cluster: str = "",
    ) -> None:
        self.kube = kube
        self.cluster = cluster
        self.client = client
        self.task_queue = task_queue
        self.resync = max(1, int(resync_seconds))
        self.on_synced = on_synced
        self.started: set[str] = set()
        self.synced = False
        self.retry_every = retry_every
        self.retry_first = retry_first
        self.names: dict[str, str] = {}  # uid -> node name, for the nodes whose termination started
        self.failures: dict[str, int] = {}  # uid -> terminations that ended without finishing
        self.waiting: dict[str, str] = {}  # node -> why its termination waits, and until when
        self._next_try: dict[str, datetime] = {}
        self._nodes: dict[str, Json] = {}  # uid -> the watch's last view of a deleting node
        self._checked_at: datetime | None = None  # the last check's start: visibility is asked since
        self.describes = 0  # workflows described by the checks so far (figures for tests)
        self.visibility_failures = 0

    async def run(self) -> None:
        """Forever: list, handle every node, watch from the list's resourceVersion; again on any end.
        Beside it, terminations that ended without finishing are started again with backoff."""
        retrying = asyncio.create_task(self._retry_loop(), name="termination-retries")
        try:
            await self._watch_loop()
        finally:
            retrying.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await retrying

    async def _retry_loop(self) -> None:
        while True:
            await asyncio.sleep(self.retry_every)
            try:
                await self.retry_unfinished()
            except asyncio.CancelledError:
                raise
            except Exception as err:
                log.warning("node-deletion watcher: checking terminations failed: %r", err)

    async def retry_unfinished(self, now: datetime | None = None) -> list[str]:
        """Start again the terminations of deleting nodes that closed without finishing, once their
        backoff has passed. Returns the nodes started again."""
        now = now or datetime.now(UTC)
        restarted = []
        for uid in await self._suspects(now):
            name, node = self.names.get(uid), self._nodes.get(uid)
            if name is None or node is None:
                continue  # forgotten meanwhile: the node is gone
            handle = self.client.get_workflow_handle(termination_workflow_id(self.cluster, name, uid))
            described = await handle.describe()
            self.describes += 1
            if described.status not in UNFINISHED:
                continue
            if uid not in self._next_try:
                self.failures[uid] = self.failures.get(uid, 0) + 1
                delay = min(self.retry_first * 2 ** (self.failures[uid] - 1), RETRY_MAX)
                self._next_try[uid] = now + delay
                self.waiting[name] = (
                    f"termination {described.status.name.lower()} ({self.failures[uid]} time(s)); "
                    f"started again at {self._next_try[uid]:%H:%M:%S}"
                )
                log.warning("node %s: %s", name, self.waiting[name])
            if now >= self._next_try[uid]:
                del self._next_try[uid]
                self.started.discard(uid)
                await self._consider(node)
                restarted.append(name)
        return restarted

    async def _suspects(self, now: datetime) -> list[str]:
        """The tracked nodes whose termination may have closed unfinished: those waiting for their
        retry, and those visibility lists as closed unfinished since the last check; every one on
        the first check, or when visibility fails."""
        since, self._checked_at = self._checked_at, now
        if since is None:
            return list(self.names)
        waiting = set(self._next_try)
        ids = {termination_workflow_id(self.cluster, name, uid): uid for uid, name in self.names.items()}
        statuses = ", ".join(f"'{status.name.title().replace('_', '')}'" for status in UNFINISHED)
        query = (
            f"WorkflowType = 'TerminationWorkflow' AND ExecutionStatus IN ({statuses}) "
            f"AND CloseTime >= '{(since - VISIBILITY_LAG).isoformat()}'"
        )
        try:
            async for execution in self.client.list_workflows(query):
                if execution.id in ids:
                    waiting.add(ids[execution.id])
        except Exception as err:
            self.visibility_failures += 1
            log.warning("node-deletion watcher: visibility failed (%r); describing every termination", err)
            return list(self.names)
        return [uid for uid in self.names if uid in waiting]

    def _forget(self, uid: str, name: str) -> None:
        """The node is gone: nothing of it is kept, and a node that comes back is started afresh."""
        self.started.discard(uid)
        for table in (self.names, self.failures, self._next_try, self._nodes):
            table.pop(uid, None)
        self.waiting.pop(name, None)

    async def _list(self) -> tuple[list[Json], str]:
        """Every node, page by page, and the listing's resourceVersion."""
        items: list[Json] = []
        token: str | None = None
        version = "0"
        while True:
            page = await self.kube.list_nodes(limit=LIST_PAGE, continue_token=token)
            items.extend(page.get("items") or ())
            meta = page.get("metadata") or {}
            version = str(meta.get("resourceVersion") or version)
            token = meta.get("continue") or None
            if token is None:
                return items, version

    async def _watch_loop(self) -> None:
        backoff = 0.5
        version: str | None = None  # where the next watch resumes; None: list first
        while True:
            try:
                if version is None:
                    items, version = await self._list()
                    listed = {_key(node) for node in items}
                    for uid, name in list(self.names.items()):
                        if uid not in listed:  # deleted while no watch ran: its DELETED was missed
                            self._forget(uid, name)
                    for node in items:
                        await self._consider(node)
                    self.synced = True
                    self.on_synced()
                    backoff = 0.5
                resume: str | None = version
                async for event in self.kube.watch(NODES, version, self.resync):
                    kind = event.get("type")
                    if kind == "ERROR":  # e.g. 410 Gone: the version is too old; list again
                        resume = None
                        break
                    node = event.get("object") or {}
                    resume = str((node.get("metadata") or {}).get("resourceVersion") or resume)
                    if kind == "BOOKMARK":
                        continue
                    if kind == "DELETED":
                        meta = node.get("metadata") or {}
                        self._forget(meta.get("uid", ""), meta.get("name", ""))
                    elif kind in ("ADDED", "MODIFIED"):
                        await self._consider(node)
                version = resume  # the server ended the watch: open it again from there
            except asyncio.CancelledError:
                raise
            except Exception as err:
                version = None
                self.synced = False
                log.warning("node-deletion watcher: %r; listing again in %.1fs", err, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    async def _consider(self, node: Json) -> None:
        if not needs_termination(node):
            return
        meta = node["metadata"]
        uid = _key(node)
        self._nodes[uid] = node  # the retry check's view of it, as current as the watch
        if uid in self.started:
            return
        name = meta["name"]
        handle = await self.client.start_workflow(
            "TerminationWorkflow",
            TerminationInput(
                node=name,
                uid=meta.get("uid"),
                reason="Manual",
                provider_id=(node.get("spec") or {}).get("providerID"),
            ),
            id=termination_workflow_id(self.cluster, name, uid),
            task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            search_attributes=sa.at_start([name], "Manual", (meta.get("labels") or {}).get(NODEPOOL_LABEL)),
        )
        self.started.add(uid)
        self.names[uid] = name
        self.waiting.pop(name, None)
        log.info(
            "node %s is being deleted: its termination is %s (run %s)",
            name,
            handle.id,
            handle.result_run_id,
        )
