"""The worker's cached view of the cluster: list each kind once, then follow it with a watch.

What the controller's planning activity reads instead of listing the cluster every pass (a pass at
100,000 pods must not list them all). Each kind has its own informer, as client-go's: list, remember
the resourceVersion, watch from there, apply ADDED / MODIFIED / DELETED to the cache, and list again
when the watch says the version is too old (410 Gone) or fails. Nothing is decided before every
kind has been listed once (`synced`), like Karpenter's cluster-state sync gate.

Optional kinds (the seed-era Provisioner and AWSNodeTemplate, and karpflow's own MaintenanceWindow
and NodeDisruptionBudget: CRDs a cluster may not have) count as synced and empty when the server
does not serve them, and are tried again later. Only "not served" (404) counts as empty: a kind the
worker may not read (403) keeps the cache unsynced, so no pass decides without the operator's controls.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

from kube.client import Json, KubeApi, KubeError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resource:
    kind: str
    api_version: str
    plural: str
    optional: bool = False

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
)


def _key(obj: Json) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


@dataclass
class InformerStats:
    lists: int = 0
    watches: int = 0
    events: int = 0
    relists_gone: int = 0
    errors: int = 0


@dataclass
class Informer:
    kube: KubeApi
    resource: Resource
    watch_timeout: int = 300
    items: dict[str, Json] = field(default_factory=dict)
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    stats: InformerStats = field(default_factory=InformerStats)
    missing: bool = False  # an optional kind the server does not serve

    def _stamp(self, obj: Json) -> Json:
        # List items carry no kind; the snapshot dispatches on it.
        obj.setdefault("kind", self.resource.kind)
        obj.setdefault("apiVersion", self.resource.api_version)
        return obj

    async def run(self) -> None:
        backoff = 0.5
        while True:
            try:
                version = await self._list()
                backoff = 0.5
                if self.missing:
                    await asyncio.sleep(60)
                    continue
                while version is not None:
                    version = await self._watch(version)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                self.stats.errors += 1
                log.warning("informer %s: %r; listing again in %.1fs", self.resource.kind, err, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    async def _list(self) -> str:
        self.stats.lists += 1
        try:
            listing = await self.kube.request("GET", self.resource.path)
        except KubeError as err:
            if self.resource.optional and err.status == 404:
                self.items, self.missing = {}, True
                self.synced.set()
                return "0"
            raise
        self.missing = False
        self.items = {_key(obj): self._stamp(obj) for obj in listing.get("items") or ()}
        self.synced.set()
        return str((listing.get("metadata") or {}).get("resourceVersion") or "0")

    async def _watch(self, version: str) -> str | None:
        """Follow changes from `version`; the version to resume from, or None to list again."""
        self.stats.watches += 1
        async for event in self.kube.watch(self.resource.path, version, self.watch_timeout):
            kind = event.get("type")
            obj = event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    self.stats.relists_gone += 1
                return None
            self.stats.events += 1
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            if kind == "BOOKMARK":
                continue
            if kind == "DELETED":
                self.items.pop(_key(obj), None)
            elif kind in ("ADDED", "MODIFIED"):
                self.items[_key(obj)] = self._stamp(obj)
        return version  # the server ended the stream: watch again from where it stopped


class ClusterCache:
    """Every informer of RESOURCES, run as tasks of the worker's event loop."""

    def __init__(
        self, kube: KubeApi, resources: tuple[Resource, ...] = RESOURCES, watch_timeout: int = 300
    ) -> None:
        self.informers = [Informer(kube, r, watch_timeout) for r in resources]
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        if not self._tasks:
            self._tasks = [
                asyncio.create_task(i.run(), name=f"informer-{i.resource.plural}") for i in self.informers
            ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    @property
    def started(self) -> bool:
        return bool(self._tasks)

    @property
    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.informers)

    async def wait_synced(self, within: float) -> bool:
        try:
            async with asyncio.timeout(within):
                await asyncio.gather(*(i.synced.wait() for i in self.informers))
        except TimeoutError:
            return False
        return True

    def unsynced(self) -> list[str]:
        return [i.resource.kind for i in self.informers if not i.synced.is_set()]

    def objects(self) -> Iterator[Json]:
        for informer in self.informers:
            yield from list(informer.items.values())

    def stats(self) -> dict[str, InformerStats]:
        return {i.resource.kind: i.stats for i in self.informers}


async def list_cluster(kube: KubeApi, resources: tuple[Resource, ...] = RESOURCES) -> list[Json]:
    """Every object a pass reads, listed once (what `karpflow plan --live` plans on)."""
    informers = [Informer(kube, resource) for resource in resources]
    await asyncio.gather(*(informer._list() for informer in informers))
    return [obj for informer in informers for obj in informer.items.values()]
