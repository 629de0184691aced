"""The simulated Karpenter's node termination (kubernetes-sigs/karpenter
pkg/controllers/node/termination and its terminator), as its code does it, paraphrased.

It acts on every Node that is being deleted, still carries the `karpenter.sh/termination`
finalizer and carries Karpenter's NodeClass label (`karpenter.k8s.aws/ec2nodeclass`), whoever
deleted it and whether or not a NodeClaim names it:

1. the node's NodeClaim (by providerID), if it is not deleting yet, is deleted;
2. a NotReady node whose instance EC2 no longer has loses its finalizer at once (no drain);
3. the drain deadline is the NodeClaim's `karpenter.sh/nodeclaim-termination-timestamp`;
4. the node is tainted `karpenter.sh/disrupted:NoSchedule` and labelled
   exclude-from-external-load-balancers;
5. drain: the pods it waits for are those not terminal, not tolerating the disrupted taint, not
   mirror pods and not stuck terminating (deleted more than a minute ago); in tiers (non-critical,
   non-critical DaemonSet, critical, critical DaemonSet), the first tier with pods left is evicted
   through the Eviction API with a UID precondition (429 from a PDB, or 500 for a pod under several
   PDBs: tried again later); do-not-disrupt pods are waited for, never evicted; a pod whose grace
   period would outlast the deadline is deleted with the time left (at least 1 s), PDBs or not;
   draining lasts at least 5 s (MinDrainTime) when there is a NodeClaim;
6. (volume attachments: the simulator runs no attach-detach controller, so there are none to wait for);
7. with a NodeClaim, the instance is terminated and `InstanceTerminating=True`, until EC2 says it is
   gone; without one, the instance is left (the NodeClaim's own finalizer, or the instance garbage
   collection, ends it);
8. the node's finalizer is removed.

Evictions and pod deletions go through the emulator's HTTP API, as a real Karpenter's do, so the
invariant checker judges them like any client's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import ssl
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import aiohttp

from api import constants as k
from sim.apiserver.errors import NotFound
from sim.controllers.karpenter.conditions import set_condition
from sim.controllers.karpenter.nodeclaims import (
    condition,
    instance_id_of,
    parse_time,
    provider_id_of,
)
from sim.controllers.predicates import node_ready, tolerated
from sim.invariants import is_protected

if TYPE_CHECKING:
    from sim.controllers.karpenter.neighbour import KarpenterNeighbour

log = logging.getLogger(__name__)

Obj = dict[str, Any]
DISRUPTED_TAINT = {"key": k.DISRUPTED_TAINT_KEY, "effect": "NoSchedule"}
CRITICAL = ("system-cluster-critical", "system-node-critical")


class KubeHttp:
    """The few API calls the simulated Karpenter makes over HTTP (a client like any other)."""

    def __init__(self, endpoint: str, token: str, ca_pem: bytes | None) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}", "User-Agent": "karpenter-sim"}
        self.ssl: ssl.SSLContext | bool = False
        if ca_pem is not None:
            self.ssl = ssl.create_default_context(cadata=ca_pem.decode())
        self._session: aiohttp.ClientSession | None = None

    async def _request(self, method: str, path: str, body: Obj) -> int:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        async with self._session.request(
            method, self.endpoint + path, json=body, headers=self.headers, ssl=self.ssl
        ) as response:
            await response.read()
            return response.status

    async def evict(self, pod: Obj) -> int:
        meta = pod["metadata"]
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "deleteOptions": {"preconditions": {"uid": meta["uid"]}},
        }
        path = f"/api/v1/namespaces/{quote(meta['namespace'])}/pods/{quote(meta['name'])}/eviction"
        return await self._request("POST", path, body)

    async def delete_pod(self, pod: Obj, grace_seconds: int) -> int:
        meta = pod["metadata"]
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": grace_seconds,
            "preconditions": {"uid": meta["uid"]},
        }
        return await self._request(
            "DELETE", f"/api/v1/namespaces/{quote(meta['namespace'])}/pods/{quote(meta['name'])}", body
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _owner_kind(pod: Obj) -> str | None:
    for ref in pod["metadata"].get("ownerReferences") or ():
        if ref.get("controller"):
            return str(ref.get("kind"))
    return None


def _tier(pod: Obj) -> int:
    critical = (pod.get("spec") or {}).get("priorityClassName") in CRITICAL
    return (2 if critical else 0) + (1 if _owner_kind(pod) == "DaemonSet" else 0)


def _grace(pod: Obj) -> int:
    value = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    return 30 if value is None else int(value)


class NodeTermination:
    def __init__(self, neighbour: KarpenterNeighbour) -> None:
        self.n = neighbour
        self._drain_started: dict[str, float] = {}  # node uid -> monotonic start

    def _waited_for(self, pod: Obj, now: datetime) -> bool:
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return False
        if tolerated((pod.get("spec") or {}).get("tolerations"), DISRUPTED_TAINT):
            return False
        annotations = pod["metadata"].get("annotations") or {}
        if k.MIRROR_POD_ANNOTATION in annotations or _owner_kind(pod) == "Node":
            return False
        deleted = parse_time(pod["metadata"].get("deletionTimestamp"))
        stuck = timedelta(seconds=self.n.scale.seconds(self.n.timings.stuck_terminating))
        return not (deleted is not None and now - deleted > stuck)

    async def reconcile(self, node: Obj) -> None:
        meta = node["metadata"]
        if (
            not meta.get("deletionTimestamp")
            or k.TERMINATION_FINALIZER not in (meta.get("finalizers") or ())
            or k.EC2NODECLASS_LABEL not in (meta.get("labels") or {})
        ):
            return
        name = meta["name"]
        claims = self.n.nodeclaims_for(provider_id_of(node))
        claim = claims[0] if len(claims) == 1 else None  # several: no single source of truth
        if claim is not None and not claim["metadata"].get("deletionTimestamp"):
            self.n.lifecycle.delete(claim, f"its node {name} is being deleted")
        instance_id = instance_id_of(provider_id_of(node))
        if not node_ready(node) and (
            instance_id is None or await asyncio.to_thread(self.n.instance_gone, instance_id)
        ):
            self._release(node, "its instance is gone")
            return
        deadline = None
        if claim is not None:
            deadline = parse_time(
                (claim["metadata"].get("annotations") or {}).get(k.TERMINATION_TIMESTAMP_ANNOTATION)
            )
        self._taint(name)
        started = self._drain_started.setdefault(meta["uid"], time.monotonic())
        if claim is not None and condition(claim, "Drained") is None:
            self.n.lifecycle.update_status(
                claim, lambda s: set_condition(s, "Drained", "Unknown", "Draining", "Draining")
            )
        if not await self._drain(node, deadline):
            return
        if claim is not None and time.monotonic() - started < self.n.scale.seconds(self.n.timings.min_drain):
            return
        if claim is not None:
            current = self.n.store_get("nodeclaims", claim["metadata"]["name"]) or claim
            self.n.lifecycle.update_status(current, lambda s: set_condition(s, "Drained", "True", "Drained"))
            self.n.lifecycle.update_status(
                current, lambda s: set_condition(s, "VolumesDetached", "True", "VolumesDetached")
            )
            if instance_id is not None:
                gone = await asyncio.to_thread(self.n.terminate_instance, instance_id)
                self.n.lifecycle.update_status(
                    current, lambda s: set_condition(s, "InstanceTerminating", "True", "InstanceTerminating")
                )
                if not gone:
                    return
        self._release(node, "drained")

    def _taint(self, name: str) -> None:
        def taint(obj: Obj) -> None:
            spec = obj.setdefault("spec", {})
            taints = list(spec.get("taints") or [])
            if not any(
                t.get("key") == k.DISRUPTED_TAINT_KEY and t.get("effect") == "NoSchedule" for t in taints
            ):
                taints = [t for t in taints if t.get("key") != k.DISRUPTED_TAINT_KEY]
                spec["taints"] = [*taints, dict(DISRUPTED_TAINT)]
            labels = obj["metadata"].setdefault("labels", {})
            labels[k.EXCLUDE_LB_LABEL] = "karpenter"

        with contextlib.suppress(NotFound):
            self.n.store.mutate("nodes", name, taint)

    def _release(self, node: Obj, why: str) -> None:
        def drop(obj: Obj) -> None:
            finalizers = obj["metadata"].get("finalizers") or []
            obj["metadata"]["finalizers"] = [f for f in finalizers if f != k.TERMINATION_FINALIZER]

        self._drain_started.pop(node["metadata"]["uid"], None)
        with contextlib.suppress(NotFound):
            self.n.store.mutate("nodes", node["metadata"]["name"], drop)
        log.info("karpenter: node %s terminated (%s)", node["metadata"]["name"], why)

    async def _drain(self, node: Obj, deadline: datetime | None) -> bool:
        """One pass of the drain; True when no pod is left to wait for."""
        now = datetime.now(UTC)
        pods = [p for p in self.n.store.pods_on_node(node["metadata"]["name"]) if self._waited_for(p, now)]
        if not pods:
            return True
        forced = set()
        if deadline is not None:
            for pod in pods:
                left = (deadline - now).total_seconds()
                deleted = parse_time(pod["metadata"].get("deletionTimestamp"))
                if (deleted is None and left <= _grace(pod)) or (deleted is not None and deleted > deadline):
                    forced.add(pod["metadata"]["uid"])
                    await self.n.http.delete_pod(pod, max(math.ceil(left), 1))
        tier = min(_tier(p) for p in pods)
        for pod in pods:
            meta = pod["metadata"]
            if (
                _tier(pod) != tier
                or meta.get("deletionTimestamp")
                or meta["uid"] in forced
                or is_protected(pod, now)
            ):
                continue
            status = await self.n.http.evict(pod)
            self.n.evictions[status] = self.n.evictions.get(status, 0) + 1
        return False
