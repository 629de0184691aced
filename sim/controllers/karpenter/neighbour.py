"""The simulated Karpenter neighbour: the loop that runs its controllers, its instance and NodeClaim
garbage collection, and its disruption controller's crash cleanup.

Garbage collection (paraphrased from Karpenter's code):

- **instances** (aws/karpenter-provider-aws pkg/controllers/nodeclaim/garbagecollection): list the
  cloud's instances first (DescribeInstances filtered on the tag keys `karpenter.sh/nodepool` and
  `karpenter.k8s.aws/ec2nodeclass`, the tag `eks:eks-cluster-name=<cluster>`, and the states pending,
  running, stopping, stopped and shutting-down), then the NodeClaims; every instance not shutting
  down, launched more than 30 s ago, whose providerID no NodeClaim has is terminated, and its Node
  (if one has its providerID) deleted, without a drain. Every 10 s for the first 20 passes, then
  every 2 min.
- **NodeClaims** (kubernetes-sigs/karpenter pkg/controllers/nodeclaim/garbagecollection): a
  registered NodeClaim whose instance the cloud no longer lists is deleted, unless its Node is still
  Ready (a live kubelet says the machine exists). Every 2 min.

Crash cleanup (kubernetes-sigs/karpenter pkg/controllers/disruption/controller.go, every pass of the
disruption loop, 10 s apart when there is nothing to disrupt): every node that has a NodeClaim, is
not in Karpenter's orchestration queue (the neighbour disrupts nothing, so its queue is empty) and is
not marked for deletion (its NodeClaim deleting or InstanceTerminating, or the node itself deleting)
loses its `karpenter.sh/disrupted:NoSchedule` taint (matched by key and effect), and its NodeClaim its
`DisruptionReason` condition. Nodes without a NodeClaim are not touched.

What the neighbour does that karpflow must survive is also reported to the invariant checker:
an instance it garbage-collected (`garbage-collected`) and a disrupted taint a karpflow command held
that it removed (`taint-stripped`). Not simulated: Karpenter's provisioner (pending pods do not get
NodeClaims), its own disruption methods, expiration and drift (the NodePools beside karpflow zero
them), interruption handling, events and metrics.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from api import constants as k
from planner.catalog import Catalog
from sim.apiserver.errors import NotFound
from sim.apiserver.store import Store
from sim.controllers.informer import Informer
from sim.controllers.karpenter.nodeclaims import (
    GONE,
    NodeClaimLifecycle,
    condition,
    is_true,
    provider_id_of,
)
from sim.controllers.karpenter.termination import KubeHttp, NodeTermination
from sim.controllers.karpenter.userdata import ClusterBootstrap
from sim.controllers.predicates import node_ready
from sim.timescale import TimeScale

log = logging.getLogger(__name__)

Obj = dict[str, Any]
# invariant, subject, message, details: sim.invariants.InvariantChecker.record
Reporter = Callable[[str, str, str, dict[str, Any]], None]
LISTED_STATES = ("pending", "running", "stopping", "stopped", "shutting-down")
HOLDER_ANNOTATION = "karpflow.io/disruption-command"  # read to say whose taint was removed


@dataclass
class KarpenterTimings:
    """Karpenter's delays in base seconds (scaled by the simulator's TimeScale)."""

    tick: float = 1.0  # requeue of the lifecycle and termination controllers
    instance_gc_age: float = 30.0
    instance_gc_fast: float = 10.0  # period of the first `instance_gc_fast_passes` passes
    instance_gc_fast_passes: int = 20
    instance_gc: float = 120.0
    nodeclaim_gc: float = 120.0
    disruption: float = 10.0  # the disruption loop's polling period
    min_drain: float = 5.0
    stuck_terminating: float = 60.0
    launch_ttl: float = 300.0
    registration_ttl: float = 900.0
    unavailable_offering_ttl: float = 180.0
    min_tick_real: float = 0.05  # floor in real seconds, so a tiny time scale does not spin


class KarpenterNeighbour:
    name = "karpenter"

    def __init__(
        self,
        store: Store,
        *,
        ec2: Any,
        cluster_name: str,
        region: str,
        timescale: TimeScale,
        catalog: Catalog,
        bootstrap: ClusterBootstrap,
        api_endpoint: str,
        api_token: str,
        api_ca_pem: bytes | None = None,
        reporter: Reporter | None = None,
        timings: KarpenterTimings | None = None,
    ) -> None:
        self.store = store
        self.ec2 = ec2
        self.cluster_name = cluster_name
        self.region = region
        self.scale = timescale
        self.catalog = catalog
        self.bootstrap = bootstrap
        self.timings = timings or KarpenterTimings()
        self.reporter = reporter
        self.informer = Informer(store, ("nodeclaims", "nodes", "nodepools", "ec2nodeclasses"))
        self.http = KubeHttp(api_endpoint, api_token, api_ca_pem)
        self.lifecycle = NodeClaimLifecycle(self)
        self.termination = NodeTermination(self)
        self.garbage_collected: list[Obj] = []  # instances the instance GC terminated
        self.taints_removed: list[Obj] = []  # disrupted taints the crash cleanup removed
        self.evictions: dict[int, int] = {}  # HTTP status -> count
        self.actions: collections.deque[str] = collections.deque(maxlen=200)
        self.gc_passes = 0

    # -- the loop -----------------------------------------------------------------------------------

    def _period(self, base: float) -> float:
        return max(self.timings.min_tick_real, self.scale.seconds(base))

    async def run(self) -> None:
        self.informer.start()
        now = time.monotonic()
        next_instance_gc = now + self._period(self.timings.instance_gc_fast)
        next_claim_gc = now + self._period(self.timings.nodeclaim_gc)
        next_cleanup = now
        while True:
            await self._guarded("NodeClaim lifecycle", self._reconcile_nodeclaims())
            await self._guarded("node termination", self._reconcile_nodes())
            now = time.monotonic()
            if now >= next_cleanup:
                self.informer.sync()
                await self._guarded("disruption crash cleanup", self.remove_stray_taints())
                next_cleanup = now + self._period(self.timings.disruption)
            if now >= next_instance_gc:
                await self._guarded("instance garbage collection", self.collect_instances())
                fast = self.gc_passes <= self.timings.instance_gc_fast_passes
                next_instance_gc = time.monotonic() + self._period(
                    self.timings.instance_gc_fast if fast else self.timings.instance_gc
                )
            if now >= next_claim_gc:
                await self._guarded("NodeClaim garbage collection", self.collect_nodeclaims())
                next_claim_gc = time.monotonic() + self._period(self.timings.nodeclaim_gc)
            await asyncio.sleep(self._period(self.timings.tick))

    async def _guarded(self, what: str, step: Any) -> None:
        try:
            await step
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("simulated karpenter: %s failed; trying again next pass", what)

    async def _reconcile_nodeclaims(self) -> None:
        self.informer.sync()
        for claim in list(self.informer.items("nodeclaims")):
            if claim["metadata"].get("deletionTimestamp"):
                await self.lifecycle.finalize(claim)
            else:
                self.lifecycle.reconcile(claim)

    async def _reconcile_nodes(self) -> None:
        self.informer.sync()
        for node in list(self.informer.items("nodes")):
            if node["metadata"].get("deletionTimestamp"):
                await self.termination.reconcile(node)

    def stop(self) -> None:
        self.informer.stop()
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().create_task(self.http.close())

    # -- shared helpers -----------------------------------------------------------------------------

    def store_get(self, resource: str, name: str) -> Obj | None:
        try:
            return self.store.get(resource, name)
        except NotFound:
            return None

    def nodeclaims_for(self, provider_id: str) -> list[Obj]:
        return [
            c for c in self.informer.items("nodeclaims") if provider_id and provider_id_of(c) == provider_id
        ]

    def record_action(self, text: str) -> None:
        self.actions.append(f"{datetime.now(UTC):%H:%M:%S} {text}")

    def _report(self, invariant: str, subject: str, message: str, details: Obj) -> None:
        if self.reporter is not None:
            self.reporter(invariant, subject, message, details)

    def _describe(self, instance_id: str) -> Obj | None:
        try:
            response = self.ec2.describe_instances(InstanceIds=[instance_id])
        except Exception as err:
            if "InvalidInstanceID.NotFound" in str(err):
                return None
            raise
        found = [i for r in response.get("Reservations") or () for i in r.get("Instances") or ()]
        return found[0] if found else None

    def instance_gone(self, instance_id: str) -> bool:
        """Karpenter's cloud Get: NotFound for an instance shutting down or terminated (blocking)."""
        instance = self._describe(instance_id)
        return instance is None or instance["State"]["Name"] in GONE

    def terminate_instance(self, instance_id: str) -> bool:
        """Karpenter's cloud Delete; True once EC2 says the instance is gone (blocking)."""
        if self.instance_gone(instance_id):
            return True
        with contextlib.suppress(Exception):
            self.ec2.terminate_instances(InstanceIds=[instance_id])
        return self.instance_gone(instance_id)

    def tag_instance(self, provider_id: str, tags: dict[str, str]) -> None:
        """The tagging controller: the instance gets tags it does not have yet (in the background)."""
        instance_id = provider_id.rsplit("/", 1)[-1]

        def tag() -> None:
            instance = self._describe(instance_id)
            if instance is None:
                return
            have = {t["Key"] for t in instance.get("Tags") or ()}
            missing = [{"Key": key, "Value": value} for key, value in tags.items() if key not in have]
            if missing:
                self.ec2.create_tags(Resources=[instance_id], Tags=missing)

        async def run() -> None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(tag)

        asyncio.get_running_loop().create_task(run())

    # -- garbage collection -------------------------------------------------------------------------

    def _cloud_instances(self) -> list[Obj]:
        filters = [
            {"Name": "tag-key", "Values": [k.TAG_NODEPOOL]},
            {"Name": "tag-key", "Values": [k.TAG_NODECLASS]},
            {"Name": f"tag:{k.TAG_EKS_CLUSTER_NAME}", "Values": [self.cluster_name]},
            {"Name": "instance-state-name", "Values": list(LISTED_STATES)},
        ]
        paginator = self.ec2.get_paginator("describe_instances")
        return [
            instance
            for page in paginator.paginate(Filters=filters)
            for reservation in page.get("Reservations") or ()
            for instance in reservation.get("Instances") or ()
        ]

    async def collect_instances(self) -> None:
        instances = await asyncio.to_thread(self._cloud_instances)  # the cloud first, then the cluster
        self.informer.sync()
        claimed = {provider_id_of(c) for c in self.informer.items("nodeclaims") if provider_id_of(c)}
        nodes = {provider_id_of(n): n for n in self.informer.items("nodes")}
        age = self.scale.seconds(self.timings.instance_gc_age)
        now = datetime.now(UTC)
        for instance in instances:
            if instance["State"]["Name"] == "shutting-down":
                continue
            provider_id = k.aws_provider_id(instance["Placement"]["AvailabilityZone"], instance["InstanceId"])
            launched = instance.get("LaunchTime")
            if provider_id in claimed or not isinstance(launched, datetime):
                continue
            if (now - launched.astimezone(UTC)).total_seconds() <= age:
                continue
            await asyncio.to_thread(self.terminate_instance, instance["InstanceId"])
            node = nodes.get(provider_id)
            if node is not None:
                with contextlib.suppress(NotFound):
                    self.store.delete("nodes", node["metadata"]["name"])
            tags = {t["Key"]: t.get("Value", "") for t in instance.get("Tags") or ()}
            entry = {
                "instance": instance["InstanceId"],
                "node": node["metadata"]["name"] if node is not None else None,
                "nodepool": tags.get(k.TAG_NODEPOOL),
            }
            self.garbage_collected.append(entry)
            self.record_action(f"garbage-collected instance {entry['instance']} (no NodeClaim)")
            log.warning("karpenter: garbage-collected instance %s: no NodeClaim has it", entry["instance"])
            self._report(
                "garbage-collected",
                f"instance {entry['instance']}",
                f"Karpenter terminated instance {entry['instance']} (NodePool {entry['nodepool']}"
                + (f", node {entry['node']} deleted without a drain" if entry["node"] else "")
                + "): it is tagged for a NodePool and no NodeClaim names it",
                entry,
            )
        self.gc_passes += 1

    async def collect_nodeclaims(self) -> None:
        instances = await asyncio.to_thread(self._cloud_instances)
        listed = {
            k.aws_provider_id(i["Placement"]["AvailabilityZone"], i["InstanceId"])
            for i in instances
            if i["State"]["Name"] != "shutting-down"
        }
        self.informer.sync()
        for claim in list(self.informer.items("nodeclaims")):
            provider_id = provider_id_of(claim)
            if claim["metadata"].get("deletionTimestamp") or not is_true(claim, "Registered"):
                continue
            if provider_id in listed:
                continue
            nodes = self.lifecycle.nodes_for(provider_id)
            if nodes and node_ready(nodes[0]):
                continue
            self.lifecycle.delete(claim, "garbage_collected: its instance is gone")

    # -- the disruption controller's crash cleanup --------------------------------------------------

    async def remove_stray_taints(self) -> None:
        claims = {provider_id_of(c): c for c in self.informer.items("nodeclaims") if provider_id_of(c)}
        for node in list(self.informer.items("nodes")):
            claim = claims.get(provider_id_of(node))
            if claim is None or node["metadata"].get("deletionTimestamp"):
                continue
            if claim["metadata"].get("deletionTimestamp") or is_true(claim, "InstanceTerminating"):
                continue
            if condition(claim, "DisruptionReason") is not None:
                self.lifecycle.update_status(claim, _clear_disruption_reason)
            taints = (node.get("spec") or {}).get("taints") or []
            if not any(
                t.get("key") == k.DISRUPTED_TAINT_KEY and t.get("effect") == "NoSchedule" for t in taints
            ):
                continue
            self._untaint(node)

    def _untaint(self, node: Obj) -> None:
        name = node["metadata"]["name"]
        holder = (node["metadata"].get("annotations") or {}).get(HOLDER_ANNOTATION)

        def untaint(obj: Obj) -> None:
            spec = obj.setdefault("spec", {})
            spec["taints"] = [
                t
                for t in spec.get("taints") or []
                if not (t.get("key") == k.DISRUPTED_TAINT_KEY and t.get("effect") == "NoSchedule")
            ]

        try:
            self.store.mutate("nodes", name, untaint)
        except NotFound:
            return
        entry = {"node": name, "holder": holder}
        self.taints_removed.append(entry)
        self.record_action(f"removed {k.DISRUPTED_TAINT_KEY} from node {name} (held by {holder or 'nobody'})")
        log.warning("karpenter: removed %s from node %s (not in its queue)", k.DISRUPTED_TAINT_KEY, name)
        if holder:
            self._report(
                "taint-stripped",
                f"node {name}",
                f"Karpenter removed {k.DISRUPTED_TAINT_KEY} from node {name} while {holder} held it: the "
                "node has a NodeClaim and is not in Karpenter's own disruption queue",
                entry,
            )

    def status(self) -> Obj:
        return {
            "garbage_collected": list(self.garbage_collected),
            "taints_removed": list(self.taints_removed),
            "evictions": dict(self.evictions),
            "gc_passes": self.gc_passes,
            "actions": list(self.actions)[-20:],
        }


def _clear_disruption_reason(status: Obj) -> bool:
    before = len(status.get("conditions") or [])
    status["conditions"] = [c for c in status.get("conditions") or [] if c.get("type") != "DisruptionReason"]
    return len(status["conditions"]) != before
