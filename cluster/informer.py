"""The worker's cached view of the cluster: list each kind once, then follow it with a watch.

What the controller's planning activity reads instead of listing the cluster every pass (a pass at
100,000 pods must not list them all). Each kind has its own informer, as client-go's: list, remember
the resourceVersion, watch from there, apply ADDED / MODIFIED / DELETED to the cache, and list again
when the watch says the version is too old (410 Gone) or fails. Nothing is decided before every
kind has been listed once (`synced`), like Karpenter's cluster-state sync gate.

Optional kinds (the seed-era Provisioner and AWSNodeTemplate, Karpenter's NodeOverlay, karpflow's
own MaintenanceWindow and NodeDisruptionBudget, the CapacityBuffer and the PodTemplates buffers
name: kinds a cluster may not serve) count as synced and empty when the server does not serve them,
and are tried again later. Only "not served" (404) counts as empty: a kind the worker may not read
(403) keeps the cache unsynced, so no pass decides without the operator's controls.

Lists come in pages (`limit`/`continue`, 500 objects a page as client-go's pager), so no response
holds a whole kind at 100,000 pods. A relist (the watch ended in error or 410 Gone) asks first for
what is not older than the last version this cache saw (`resourceVersionMatch=NotOlderThan`), which
kube-apiserver answers from its watch cache rather than from etcd; only if that is refused (410) is
the list made consistent (no resourceVersion: a quorum read), as client-go's reflector does
(k8s.io/client-go tools/cache/reflector.go `relistResourceVersion`). A continue token that expired
mid-list (410) starts the list again, consistent. Watches ask for bookmarks, which move the version
a relist resumes from even while nothing changes.

Besides the planner's kinds, the worker caches what its activities poll (`ACTIVITY_RESOURCES`:
VolumeAttachments), and indexes a few kinds for them (pods and VolumeAttachments by node, nodes by
providerID, PDBs by namespace): cluster/reads.py is how the activities read this cache.

Synced once is not current for ever: a kind whose view is older than `stale_after` seconds (no open
watch, no event and no successful listing for that long: the watch keeps failing and so does the
listing) is stale. `stale()` says which and why; planning refuses a stale view
(activities/planning.py) and readiness turns red (worker.py), until the informer, which keeps trying,
is current again. An open watch that brings no event is current: the server ends every watch within
its timeout, and the client gives up 30 s after that.

Every listing and event also feeds a `SnapshotBuilder` (planner/snapshot_builder.py): the planner's
parsed view, kept up to date here and assembled per pass (`snapshot()`) from what changed. Given a
HeapFreezer (the worker process gives one), the long-lived heap this cache makes is frozen out of the
garbage collector's way once it is listed and parsed (cluster/heap.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cluster.heap import HeapFreezer
from kube.client import Json, KubeApi, KubeError
from planner.snapshot import Snapshot
from planner.snapshot_builder import SnapshotBuilder, object_key

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resource:
    kind: str
    api_version: str
    plural: str
    optional: bool = False
    planned: bool = True  # read by the planner (fed to the SnapshotBuilder); else only by activities

    @property
    def path(self) -> str:
        prefix = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        return f"{prefix}/{self.plural}"


# What a planning pass needs (planner/snapshot.py reads all of these).
RESOURCES: tuple[Resource, ...] = (
    Resource("Node", "v1", "nodes"),
    Resource("Pod", "v1", "pods"),
    Resource("PodDisruptionBudget", "policy/v1", "poddisruptionbudgets"),
    Resource("DaemonSet", "apps/v1", "daemonsets"),
    Resource("NodePool", "karpenter.sh/v1", "nodepools"),
    Resource("EC2NodeClass", "karpenter.k8s.aws/v1", "ec2nodeclasses"),
    Resource("NodeClaim", "karpenter.sh/v1", "nodeclaims", optional=True),
    Resource("Provisioner", "karpenter.sh/v1alpha5", "provisioners", optional=True),
    Resource("AWSNodeTemplate", "karpenter.k8s.aws/v1alpha1", "awsnodetemplates", optional=True),
    # karpflow's operator controls (deploy/crds); a cluster without the CRDs has none of them
    Resource("MaintenanceWindow", "karpflow.dev/v1alpha1", "maintenancewindows", optional=True),
    Resource("NodeDisruptionBudget", "karpflow.dev/v1alpha1", "nodedisruptionbudgets", optional=True),
    # CapacityBuffers (autoscaling.x-k8s.io, Karpenter v1.14 / Cluster Autoscaler) and the PodTemplates
    # they name: their pods keep nodes from counting as empty (planner/capacity_buffers.py)
    Resource("CapacityBuffer", "autoscaling.x-k8s.io/v1beta1", "capacitybuffers", optional=True),
    Resource("PodTemplate", "v1", "podtemplates", optional=True),
    # Karpenter's NodeOverlay (v1.7, alpha): a cluster without its CRD has none
    Resource("NodeOverlay", "karpenter.sh/v1alpha1", "nodeoverlays", optional=True),
)


# What only the activities read from the cache (cluster/reads.py): the volume wait's attachments.
# Optional: an API server without storage.k8s.io has nothing attached.
VOLUME_ATTACHMENT = Resource(
    "VolumeAttachment", "storage.k8s.io/v1", "volumeattachments", optional=True, planned=False
)
ACTIVITY_RESOURCES: tuple[Resource, ...] = (VOLUME_ATTACHMENT,)
WORKER_RESOURCES: tuple[Resource, ...] = RESOURCES + ACTIVITY_RESOURCES

PAGE_SIZE = 500  # objects per list page (client-go's pager default)

IndexKey = Callable[[Json], str | None]


def _spec_field(name: str) -> IndexKey:
    return lambda obj: (obj.get("spec") or {}).get(name) or None


def _namespace(obj: Json) -> str | None:
    return (obj.get("metadata") or {}).get("namespace") or None


# The one index each kind keeps for the activities' reads (cluster/reads.py).
INDEXES: dict[str, IndexKey] = {
    "Pod": _spec_field("nodeName"),
    "Node": _spec_field("providerID"),
    "VolumeAttachment": _spec_field("nodeName"),
    "PodDisruptionBudget": _namespace,
}

_key = object_key
# Seconds a kind's view may be older than before it is stale (its watch and its listing failing).
STALE_AFTER = 60.0
FIRST_PASS_WAIT = 60.0  # seconds the collector stays paused after the parse, waiting for a first pass
RESULT_LEAVES = 0.5  # seconds between a first pass's end and the freeze, for its result to be reported


@dataclass
class InformerStats:
    lists: int = 0
    watches: int = 0
    events: int = 0
    relists_gone: int = 0
    errors: int = 0
    received: int = 0  # objects listed or watched
    pages: int = 0  # list requests (a list is one or more pages)
    relists_resumed: int = 0  # relists that asked for no older than the cache's version


@dataclass
class Informer:
    kube: KubeApi
    resource: Resource
    watch_timeout: int = 300
    items: dict[str, Json] = field(default_factory=dict)
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    stats: InformerStats = field(default_factory=InformerStats)
    missing: bool = False  # an optional kind the server does not serve
    builder: SnapshotBuilder | None = None  # told every listing and event
    # When the view was last known current (monotonic): a listing, an event, a watch open or ended.
    current_at: float = float("-inf")
    watching: bool = False  # a watch stream is open: the view is current
    last_error: str = ""  # why the last list or watch failed ("" once one succeeds)
    version: int = 0  # bumped on every change of `items`, for indexes built from them
    page_size: int = PAGE_SIZE
    # The kind's index for the activities (INDEXES): index key -> object key -> object.
    index_key: IndexKey | None = None
    index: dict[str, dict[str, Json]] = field(default_factory=dict)
    # The newest resourceVersion seen (a listing, an event, a bookmark): where a relist resumes.
    seen_version: str = ""

    def stale_for(self, now: float | None = None) -> float:
        """Seconds the view may have missed changes for (0 while a watch is open, or while an optional
        kind the server does not serve is known absent: it is re-listed only every minute)."""
        if self.watching or (self.missing and not self.last_error):
            return 0.0
        return max(0.0, (time.monotonic() if now is None else now) - self.current_at)

    def _stamp(self, obj: Json) -> Json:
        # List items carry no kind; the snapshot dispatches on it.
        obj.setdefault("kind", self.resource.kind)
        obj.setdefault("apiVersion", self.resource.api_version)
        return obj

    async def run(self) -> None:
        backoff = 0.5
        while True:
            try:
                version: str | None = await self._list()
                backoff = 0.5
                if self.missing:
                    await asyncio.sleep(60)
                    continue
                while version is not None:
                    version = await self._watch(version)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                self.watching = False
                self.stats.errors += 1
                self.last_error = f"{type(err).__name__}: {err}"[:300]
                log.warning("informer %s: %r; listing again in %.1fs", self.resource.kind, err, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    async def _list(self) -> str:
        self.stats.lists += 1
        since = self.seen_version if self.seen_version not in ("", "0") else None
        try:
            try:
                items, version = await self._list_pages(since)
                if since is not None:
                    self.stats.relists_resumed += 1
            except KubeError as err:
                if err.status not in (400, 410) or (err.status == 400 and since is None):
                    raise
                # The version is no longer served, a continue token expired, or the server does not
                # take resourceVersionMatch (400, before Kubernetes 1.19): a consistent list.
                items, version = await self._list_pages(None)
        except KubeError as err:
            if self.resource.optional and err.status == 404:
                self._listed({}, missing=True)
                return "0"
            raise
        self._listed(items, missing=False)
        self.seen_version = version
        return version or "0"

    async def _list_pages(self, since: str | None) -> tuple[dict[str, Json], str]:
        """Every object of the kind, page by page, and the list's resourceVersion. With `since`, no
        older than that version (the server may answer from its watch cache); else consistent."""
        first: dict[str, Any] = {"limit": self.page_size}
        if since is not None:
            first |= {"resourceVersion": since, "resourceVersionMatch": "NotOlderThan"}
        items: dict[str, Json] = {}
        query, version = first, ""
        while True:
            self.stats.pages += 1
            page = await self.kube.request("GET", self.resource.path, query=query)
            for obj in page.get("items") or ():
                items[_key(obj)] = self._stamp(obj)
            meta = page.get("metadata") or {}
            version = str(meta.get("resourceVersion") or version)
            token = meta.get("continue")
            if not token:
                return items, version
            # The token carries the list's version; a resourceVersion beside it is refused.
            query = {"limit": self.page_size, "continue": token}

    def _listed(self, items: dict[str, Json], missing: bool) -> None:
        self.items, self.missing = items, missing
        if self.index_key is not None:
            self.index = {}
            for key, obj in items.items():
                self._index_add(key, obj)
        self.stats.received += len(items)
        self.version += 1
        if self.builder is not None:
            self.builder.replace(self.resource.kind, items.values())
        self._current()
        self.synced.set()

    def _index_add(self, key: str, obj: Json) -> None:
        assert self.index_key is not None
        if (at := self.index_key(obj)) is not None:
            self.index.setdefault(at, {})[key] = obj

    def _index_drop(self, key: str, obj: Json) -> None:
        assert self.index_key is not None
        at = self.index_key(obj)
        bucket = self.index.get(at) if at is not None else None
        if bucket is not None:
            bucket.pop(key, None)
            if not bucket:
                del self.index[at]  # type: ignore[arg-type]

    def _put(self, key: str, obj: Json) -> None:
        if self.index_key is not None and (old := self.items.get(key)) is not None:
            self._index_drop(key, old)
        self.items[key] = obj
        if self.index_key is not None:
            self._index_add(key, obj)

    def _drop(self, key: str) -> None:
        old = self.items.pop(key, None)
        if old is not None and self.index_key is not None:
            self._index_drop(key, old)

    def indexed(self, at: str) -> list[Json]:
        """The objects whose index key (INDEXES) is `at`."""
        return list((self.index.get(at) or {}).values())

    def _opened(self) -> None:
        self.watching = True
        self._current()

    def _current(self) -> None:
        self.current_at = time.monotonic()
        self.last_error = ""

    async def _watch(self, version: str) -> str | None:
        """Follow changes from `version`; the version to resume from, or None to list again."""
        self.stats.watches += 1
        try:
            async for event in self.kube.watch(
                self.resource.path, version, self.watch_timeout, opened=self._opened
            ):
                self._current()
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        self.stats.relists_gone += 1
                    return None
                self.stats.events += 1
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                self.seen_version = version
                if kind == "BOOKMARK":
                    continue
                if kind == "DELETED":
                    self._drop(_key(obj))
                elif kind in ("ADDED", "MODIFIED"):
                    self._put(_key(obj), self._stamp(obj))
                else:
                    continue
                self.version += 1
                self.stats.received += 1
                if self.builder is not None:
                    self.builder.apply(self.resource.kind, kind, obj)
        finally:
            if self.watching:
                self._current()  # current up to the moment the stream ended
            self.watching = False
        return version  # the server ended the stream: watch again from where it stopped


class ClusterCache:
    """Every informer of RESOURCES, run as tasks of the worker's event loop, and the planner's view of
    them (`snapshot()`)."""

    def __init__(
        self,
        kube: KubeApi,
        resources: tuple[Resource, ...] = WORKER_RESOURCES,
        watch_timeout: int = 300,
        stale_after: float = STALE_AFTER,
        heap: HeapFreezer | None = None,
    ) -> None:
        self.builder = SnapshotBuilder([r.kind for r in resources if r.planned])
        self.informers = [
            Informer(
                kube,
                r,
                watch_timeout,
                builder=self.builder if r.planned else None,
                index_key=INDEXES.get(r.kind),
            )
            for r in resources
        ]
        self._by_kind = {i.resource.kind: i for i in self.informers}
        self.stale_after = stale_after
        self.heap = heap
        self._tasks: list[asyncio.Task[None]] = []
        self._by_instance: tuple[int, dict[str, Json]] = (-1, {})
        self._ready = asyncio.Event()  # synced, and parsed for the planner
        self._first_pass = asyncio.Event()  # a pass has been planned on this view (pass_planned)

    def start(self) -> None:
        if not self._tasks:
            self._tasks = [
                asyncio.create_task(i.run(), name=f"informer-{i.resource.plural}") for i in self.informers
            ]
            self._tasks.append(asyncio.create_task(self._after_sync(), name="informer-after-sync"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        self._ready.clear()
        self._first_pass.clear()

    @property
    def _planned(self) -> list[Informer]:
        """The planner's informers: what sync, readiness and staleness are about. The activities'
        kinds (ACTIVITY_RESOURCES) are read only while current, else from the API (cluster/reads.py)."""
        return [i for i in self.informers if i.resource.planned]

    async def _after_sync(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in self._planned))
        if self.heap is None:
            await self._catch_up()
            return
        # The parse and the first pass make most of the long-lived heap (the parsed objects, the
        # pass cache): no collection walks it meanwhile, and the freeze right after collects it once.
        with self.heap.paused():
            await self._catch_up()
            with contextlib.suppress(TimeoutError):  # a worker with no controller plans no pass
                async with asyncio.timeout(FIRST_PASS_WAIT):
                    await self._first_pass.wait()
                # The freeze holds the event loop: let the pass's result leave first.
                await asyncio.sleep(RESULT_LEAVES)
        self.heap.freeze()
        await self.heap.keep_frozen(self._received, self._held)

    async def _catch_up(self) -> None:
        """Parse now what the first pass would (that pass is incremental too), then say ready. A
        failed parse only logs: each pass's snapshot parses what is still pending, and says why."""
        try:
            await asyncio.to_thread(self.builder.catch_up)
        except Exception:
            log.exception("parsing the synced cluster for the planner failed; the passes parse it")
        self._ready.set()

    def pass_planned(self) -> None:
        """A pass has been planned on this view: the heap it built can be frozen now."""
        self._first_pass.set()

    def _received(self) -> int:
        return self.builder.parsed + sum(i.stats.received for i in self.informers)

    def _held(self) -> int:
        return sum(len(i.items) for i in self.informers)

    @property
    def started(self) -> bool:
        return bool(self._tasks)

    @property
    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self._planned)

    async def wait_synced(self, within: float) -> bool:
        return await _within(asyncio.gather(*(i.synced.wait() for i in self._planned)), within)

    async def wait_ready(self, within: float) -> bool:
        """Synced, and what the sync brought parsed for the planner: what a pass waits for. The first
        pass used to start at the sync, before the parse, and both ran with the collector walking
        the freshly synced heap in full collections (2.9 s of a 7.8 s first pass at 5,000 nodes,
        4.6 s of 14.9 s at 10,000, bench/bench_controller.py); now neither collects (_after_sync)."""
        return await _within(self._ready.wait(), within)

    def unsynced(self) -> list[str]:
        return [i.resource.kind for i in self._planned if not i.synced.is_set()]

    def stale(self, now: float | None = None) -> list[str]:
        """Why the view cannot be trusted: one line per kind whose view is older than `stale_after`."""
        now = time.monotonic() if now is None else now
        out = []
        for informer in self._planned:
            if not informer.synced.is_set():
                continue  # unsynced() says so
            age = informer.stale_for(now)
            if age > self.stale_after:
                why = f": {informer.last_error}" if informer.last_error else ""
                out.append(f"{informer.resource.kind} not watched for {age:.0f}s{why}")
        return out

    def objects(self) -> Iterator[Json]:
        """Every object of the planner's kinds."""
        for informer in self.informers:
            if informer.resource.planned:
                yield from list(informer.items.values())

    def informer(self, kind: str) -> Informer | None:
        return self._by_kind.get(kind)

    def current(self, kind: str) -> Informer | None:
        """The kind's informer if its view can be read now (synced, not stale), else None."""
        informer = self._by_kind.get(kind)
        if informer is None or not informer.synced.is_set():
            return None
        if informer.stale_for() > self.stale_after:
            return None
        return informer

    def objects_of(self, kind: str) -> list[Json]:
        return [obj for i in self.informers if i.resource.kind == kind for obj in i.items.values()]

    def snapshot(
        self, now: datetime, instances: Iterable[Mapping[str, Any]] = (), held: Iterable[str] = ()
    ) -> Snapshot:
        """The planner's view at `now` (planner/snapshot_builder.py): blocking CPU work, for a thread."""
        if self.heap is not None:
            self.heap.before_pass()
        return self.builder.snapshot(now, instances, held)

    def node_by_instance(self, instance_id: str) -> Json | None:
        """The cached Node whose providerID names this EC2 instance (an index rebuilt when nodes change)."""
        nodes = next(i for i in self.informers if i.resource.kind == "Node")
        version, index = self._by_instance
        if version != nodes.version:
            index = {}
            for node in nodes.items.values():
                provider = (node.get("spec") or {}).get("providerID") or ""
                if provider.startswith("aws://"):
                    index[provider.rsplit("/", 1)[-1]] = node
            self._by_instance = (nodes.version, index)
        return index.get(instance_id)

    def stats(self) -> dict[str, InformerStats]:
        return {i.resource.kind: i.stats for i in self.informers}


async def _within(awaitable: Awaitable[Any], seconds: float) -> bool:
    """Whether `awaitable` finished within `seconds` (it is cancelled if not)."""
    try:
        async with asyncio.timeout(seconds):
            await awaitable
    except TimeoutError:
        return False
    return True


async def list_cluster(kube: KubeApi, resources: tuple[Resource, ...] = RESOURCES) -> list[Json]:
    """Every object a pass reads, listed once (what `karpflow plan --live` plans on)."""
    informers = [Informer(kube, resource) for resource in resources]
    await asyncio.gather(*(informer._list() for informer in informers))
    return [obj for informer in informers for obj in informer.items.values()]
