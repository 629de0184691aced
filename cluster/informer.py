"""An informer-style cache of the objects the planner reads, kept by the worker.

Each kind is listed once, then watched from the list's resourceVersion; a 410 Gone (the server no
longer has that history) or a broken stream re-lists. A planning pass reads the cache and sends no
request of its own for these kinds, so a pass never lists all pods. Nothing is decided before every
kind has synced (`synced`).

A kind whose API is not served (404: e.g. the legacy v1alpha5 Provisioner CRD is not installed) counts
as synced and empty, and is retried at the resync interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from kube.client import KubeApi, KubeError

log = logging.getLogger("karpflow.informer")

Json = dict[str, Any]


@dataclass(frozen=True)
class Resource:
    kind: str
    api_version: str
    path: str  # collection path
    field_selector: str | None = None


def default_resources(namespace: str) -> list[Resource]:
    """Every kind Snapshot.from_objects reads, legacy ones included."""
    return [
        Resource("Node", "v1", "/api/v1/nodes"),
        Resource("Pod", "v1", "/api/v1/pods"),
        Resource("PodDisruptionBudget", "policy/v1", "/apis/policy/v1/poddisruptionbudgets"),
        Resource("DaemonSet", "apps/v1", "/apis/apps/v1/daemonsets"),
        Resource("NodePool", "karpenter.sh/v1", "/apis/karpenter.sh/v1/nodepools"),
        Resource("NodeClaim", "karpenter.sh/v1", "/apis/karpenter.sh/v1/nodeclaims"),
        Resource("EC2NodeClass", "karpenter.k8s.aws/v1", "/apis/karpenter.k8s.aws/v1/ec2nodeclasses"),
        Resource("Provisioner", "karpenter.sh/v1alpha5", "/apis/karpenter.sh/v1alpha5/provisioners"),
        Resource(
            "AWSNodeTemplate",
            "karpenter.k8s.aws/v1alpha1",
            "/apis/karpenter.k8s.aws/v1alpha1/awsnodetemplates",
        ),
        Resource(
            "ConfigMap",
            "v1",
            f"/api/v1/namespaces/{namespace}/configmaps",
            field_selector="metadata.name=karpenter-global-settings",
        ),
    ]


def _key(obj: Json) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


@dataclass
class _Store:
    resource: Resource
    objects: dict[str, Json] = field(default_factory=dict)
    resource_version: str = ""
    synced: bool = False
    relists: int = 0


class Informer:
    """List-and-watch caches for several kinds. `await run()` until cancelled."""

    def __init__(
        self,
        kube: KubeApi,
        resources: list[Resource],
        *,
        watch_timeout: int = 300,
        retry_seconds: float = 2.0,
        page_size: int = 5000,
    ) -> None:
        self.kube = kube
        self.stores = {r.kind: _Store(r) for r in resources}
        self.watch_timeout = watch_timeout
        self.retry_seconds = retry_seconds
        self.page_size = page_size
        self.requests = 0  # API requests sent (lists, pages and watches), for benches and status
        self.changed = asyncio.Event()

    @property
    def synced(self) -> bool:
        return all(store.synced for store in self.stores.values())

    def objects(self) -> Iterator[Json]:
        """Every cached object (with `kind` and `apiVersion` set, as list items lack them)."""
        for store in self.stores.values():
            yield from store.objects.values()

    def count(self, kind: str) -> int:
        return len(self.stores[kind].objects)

    async def run(self) -> None:
        tasks = [
            asyncio.create_task(self._keep(store), name=f"informer-{k}") for k, store in self.stores.items()
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _keep(self, store: _Store) -> None:
        while True:
            try:
                if not await self._list(store):
                    await asyncio.sleep(max(self.watch_timeout, self.retry_seconds))
                    continue
                await self._watch(store)
            except asyncio.CancelledError:
                raise
            except KubeError as err:
                if err.status != 410:
                    log.warning("informer %s: %s; re-listing", store.resource.kind, err)
                    await asyncio.sleep(self.retry_seconds)
            except Exception as err:  # a broken stream: re-list after a pause
                log.warning("informer %s: %s; re-listing", store.resource.kind, err)
                await asyncio.sleep(self.retry_seconds)
            store.relists += 1

    async def _list(self, store: _Store) -> bool:
        """Replace the store with a fresh list. False when the API is not served (404)."""
        resource = store.resource
        objects: dict[str, Json] = {}
        cont: str | None = None
        while True:
            self.requests += 1
            try:
                page = await self.kube.request(
                    "GET",
                    resource.path,
                    query={
                        "limit": self.page_size,
                        "continue": cont,
                        "fieldSelector": resource.field_selector,
                    },
                )
            except KubeError as err:
                if err.status == 404:
                    store.objects, store.synced = {}, True
                    return False
                raise
            for item in page.get("items") or []:
                item.setdefault("kind", resource.kind)
                item.setdefault("apiVersion", resource.api_version)
                objects[_key(item)] = item
            meta = page.get("metadata") or {}
            cont = meta.get("continue") or None
            if cont is None:
                store.resource_version = str(meta.get("resourceVersion") or "")
                break
        store.objects = objects
        store.synced = True
        self.changed.set()
        return True

    async def _watch(self, store: _Store) -> None:
        resource = store.resource
        path = resource.path
        only = (resource.field_selector or "").removeprefix("metadata.name=") or None
        while True:
            self.requests += 1
            async for event in self.kube.watch(path, store.resource_version, self.watch_timeout):
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    code = int(obj.get("code") or 500)
                    raise KubeError(code, str(obj.get("reason") or ""), str(obj.get("message") or ""))
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if rv:
                    store.resource_version = str(rv)
                if kind == "BOOKMARK":
                    continue
                if only is not None and (obj.get("metadata") or {}).get("name") != only:
                    continue
                obj.setdefault("kind", resource.kind)
                obj.setdefault("apiVersion", resource.api_version)
                if kind == "DELETED":
                    store.objects.pop(_key(obj), None)
                else:
                    store.objects[_key(obj)] = obj
                self.changed.set()
