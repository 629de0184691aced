"""The reads the activities make in their loops, answered from the worker's informer cache.

A drain looks at its node's pods, the node and the PDBs every second; a replacement's wait looks for
its Node every second; a volume wait looks at VolumeAttachments every second; NodeDisruptionBudget
claims read every Node. Against the API server that is a LIST (or a GET) per second per node in
flight; Karpenter reads all of these from controller-runtime's cache and sends only writes and
evictions to the server. `ClusterReads` does the same: the activities run in the worker that holds
the cache (cluster/informer.py; the first read starts it on a worker that had not), and a kind's
view is used while it is current (synced and watched: `ClusterCache.current`). Until then, or on a
worker without a cache (tests of single steps), the read goes to the API server, as before.

The staleness rule (docs/DESIGN.md "Reads from the cache"): a cached object is at most one watch
delay behind the server. Whatever an activity decides on it, it acts on with a precondition the
server checks: a write carries the resourceVersion it read (409 if the object moved on: read again,
then decide again), a delete or an eviction the UID. Where "nothing is left" ends a step (a drain's
last pod, the last VolumeAttachment), the cache's answer is confirmed by one read from the API server
before the step returns, because a missed object there is not corrected by any later write.

Objects returned are the cache's own: read them, never change them (copy first: `copy.deepcopy`).
"""

from __future__ import annotations

import copy
import logging
from collections import Counter
from typing import TYPE_CHECKING

from api.constants import KARPENTER_GROUP, KARPENTER_VERSION
from kube.client import Json, KubeApi, KubeError
from kube.pdb_budget import Spent

if TYPE_CHECKING:
    from cluster.informer import ClusterCache, Informer

log = logging.getLogger(__name__)


class ClusterReads:
    """Nodes, pods, PDBs and VolumeAttachments as the activities read them: from the cache while it is
    current, else from the API server. `served` counts the answers by source ("cache", "api")."""

    def __init__(self, kube: KubeApi, cache: ClusterCache | None = None) -> None:
        self.kube = kube
        self.cache = cache
        self.served: Counter[str] = Counter()
        # What this worker's evictions took from each PDB the cache does not show yet (kube/pdb_budget.py).
        self.pdb_spent = Spent()

    def _current(self, kind: str) -> Informer | None:
        if self.cache is None:
            return None
        if not self.cache.started:
            # A worker that runs neither the controller nor the interruption poller starts its cache
            # with the first pass it plans; its activities start it too: they poll the same kinds.
            self.cache.start()
        informer = self.cache.current(kind)
        self.served["cache" if informer is not None else "api"] += 1
        return informer

    async def node(self, name: str) -> Json | None:
        """The Node of this name, or None."""
        if (nodes := self._current("Node")) is not None:
            return nodes.items.get(f"/{name}")
        return await self.kube.find_node(name)

    async def node_with_provider_id(
        self, provider_id: str, name_hint: str | None = None, list_too: bool = True, fresh: bool = False
    ) -> Json | None:
        """The Node whose spec.providerID is this, or None. From the API server (no current cache, or
        `fresh`): by `name_hint` first (a GET), then, with `list_too`, by listing every Node."""
        if not fresh and (nodes := self._current("Node")) is not None:
            found = nodes.indexed(provider_id)
            return found[0] if found else None
        if fresh:
            self.served["api"] += 1
        if name_hint:
            node = await self.kube.find_node(name_hint)
            if node is not None and (node.get("spec") or {}).get("providerID") == provider_id:
                return node
        if not list_too:
            return None
        listed: list[Json] = (await self.kube.list_nodes()).get("items") or []
        return next((n for n in listed if (n.get("spec") or {}).get("providerID") == provider_id), None)

    async def nodes(self) -> list[Json]:
        """Every Node."""
        if (nodes := self._current("Node")) is not None:
            return list(nodes.items.values())
        return list((await self.kube.list_nodes()).get("items") or [])

    def cached_object(self, kind: str, name: str) -> tuple[bool, Json | None]:
        """(whether the cache answered, the cluster-scoped object of this kind and name it holds)."""
        if (objects := self._current(kind)) is not None:
            return True, objects.items.get(f"/{name}")
        return False, None

    async def nodepool(self, name: str) -> Json | None:
        """The NodePool of this name (a copy), or None. One the cache does not hold is asked of the
        server: it may have been created a moment ago, and a guard refuses a node whose pool is gone."""
        _, found = self.cached_object("NodePool", name)
        if found is not None:
            return copy.deepcopy(found)
        try:
            return await self.kube.get_cluster_custom(KARPENTER_GROUP, KARPENTER_VERSION, "nodepools", name)
        except KubeError as err:
            if err.status == 404:
                return None
            raise

    async def cluster_custom(self, kind: str, group: str, version: str, plural: str) -> list[Json]:
        """Every object of a cluster-scoped custom kind the cache holds (none when it is not served)."""
        if (objects := self._current(kind)) is not None:
            return list(objects.items.values())
        return await self.kube.list_cluster_custom(group, version, plural)

    async def pods_on_node(self, node: str, fresh: bool = False) -> list[Json]:
        """The pods bound to the node of this name; `fresh`: from the API server, whatever the cache."""
        if not fresh and (pods := self._current("Pod")) is not None:
            return pods.indexed(node)
        if fresh:
            self.served["api"] += 1
        return await self.kube.pods_on_node(node)

    async def pdbs(self, namespace: str) -> list[Json]:
        """The namespace's PodDisruptionBudgets (none when the server has no policy/v1)."""
        if (pdbs := self._current("PodDisruptionBudget")) is not None:
            return pdbs.indexed(namespace)
        try:
            return await self.kube.pdbs(namespace)
        except KubeError as err:
            if err.status == 404:
                return []
            raise

    async def volume_attachments_on(self, node: str, fresh: bool = False) -> list[Json]:
        """The VolumeAttachments whose spec.nodeName is this node (none without storage.k8s.io)."""
        if not fresh and (attachments := self._current("VolumeAttachment")) is not None:
            return attachments.indexed(node)
        if fresh:
            self.served["api"] += 1
        try:
            listed = await self.kube.volume_attachments()
        except KubeError as err:
            if err.status == 404:
                return []
            raise
        return [va for va in listed if (va.get("spec") or {}).get("nodeName") == node]

    async def nodes_with_label(self, key: str, value: str) -> list[Json]:
        """The Nodes whose label `key` is `value` (a NodePool's: karpenter.sh/nodepool=<pool>)."""
        if (nodes := self._current("Node")) is not None:
            return [
                n
                for n in nodes.items.values()
                if ((n.get("metadata") or {}).get("labels") or {}).get(key) == value
            ]
        return list((await self.kube.list_nodes(f"{key}={value}")).get("items") or [])

    async def unbound_pods(self, slice_size: int = 10_000) -> list[Json]:
        """The Pending pods bound to no node (no spec.nodeName): what the scheduler has not placed.
        From the cache a scan of every pod (its index is by node, and these have none): ~70 ms at
        100,000 pods, so it yields to the event loop after each `slice_size` pods (~10 ms) rather
        than hold the worker's loop that long."""
        import asyncio

        if (pods := self._current("Pod")) is not None:
            every = list(pods.items.values())  # a copy: the watch may change the cache while this yields
            found: list[Json] = []
            for start in range(0, len(every), slice_size):
                if start:
                    await asyncio.sleep(0)
                found += [
                    p
                    for p in every[start : start + slice_size]
                    if not (p.get("spec") or {}).get("nodeName")
                    and (p.get("status") or {}).get("phase", "Pending") == "Pending"
                ]
            return found
        query = {"fieldSelector": "spec.nodeName=,status.phase=Pending"}
        return list((await self.kube.request("GET", "/api/v1/pods", query=query)).get("items") or [])
