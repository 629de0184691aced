"""The garbage collector of karpflow's own launches (`collect_garbage`), as Karpenter has for its own.

A replacement instance whose command closed without it, and that has no Node or one that never
initialized, is terminated (through the ownership-guarded `terminate_instance`) and its Node deleted;
each gets an `InstanceGarbageCollected` Event on its NodePool (and Node) and counts in
`karpenter_nodeclaims_disrupted_total{reason="garbage_collected"|"registration_timeout"}`. The rule
is activities/garbage_rules.py; docs/garbage-collection.md says why and how to watch it.

Where it runs: an activity of the ControllerWorkflow, every `gc_interval_seconds` (workflows/controller.py),
not a loop in each worker beside the node-deletion watcher. Karpenter's collectors are singletons:
with one loop per worker replica, every replica would list the cluster's instances, describe the
same commands, and record its own Event for the same leak. As a controller activity there is one
collection at a time per cluster, any worker can run it on its informer cache (as it runs a pass),
its failures land in the pass's `error`, and its last result is in `karpflow status`. The cost is a
workflow change (behind `controller-garbage-collection`) and one activity in the controller's
history per interval (2 min by default, Karpenter's cadence). A stopped controller collects nothing;
a paused one still does (a pause holds back commands, and collecting starts none).

The order is Karpenter's: EC2 first, then the cluster (the cache, read after the listing, so a Node
that registered meanwhile is seen), then Temporal only for the suspects. Before it acts on an
instance with a Node, the Node is read again from the API server; the Node is deleted only after its
instance is terminated (a kubelet still running would register it again), pinned to its UID.
Idempotent: a retry finds terminated instances gone from the listing, or ending with their Node left
(which it then releases); one instance's failure is a problem of the result, not of the collection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from activities import errors
from activities.disruption_metrics import disruption_labels, reschedulable_pods
from activities.ec2 import EC2Activities
from activities.errors import classify_ec2, classify_kube, not_found, retryable
from activities.garbage_rules import (
    CommandState,
    Launch,
    NodeFacts,
    Suspect,
    command_state,
    launch_of,
    suspect,
)
from activities.node_json import drop_finalizer
from api.activity_io import InstanceRequest
from api.garbage_io import CollectedInstance, GarbageCollectionRequest, GarbageCollectionResult
from api.nodepool import NodePool
from api.nodepool_reader import pool_termination_grace_period, read_nodepool
from cluster.informer import ClusterCache
from kube import events
from kube.client import Json, KubeApi, KubeError
from kube.events import ObjectRef
from runtime import metrics

log = logging.getLogger(__name__)

SYNC_TIMEOUT = 60.0  # seconds a collection waits for the cluster cache's first listing
CONCURRENCY = 10  # instances judged or terminated at a time (and commands described)


class GarbageCollector:
    def __init__(
        self,
        cache: ClusterCache,
        kube: KubeApi,
        client: Client,
        ec2: EC2Activities,
        cluster: str,
        *,
        concurrency: int = CONCURRENCY,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.cache = cache
        self.kube = kube
        self.client = client
        self.ec2 = ec2
        self.cluster = cluster
        self.events = events.recorder_for(kube)
        self._slots = asyncio.Semaphore(concurrency)
        self._now = clock or (lambda: datetime.now(UTC))

    @activity.defn(name="collect_garbage")
    async def collect_garbage(self, request: GarbageCollectionRequest) -> GarbageCollectionResult:
        beating = asyncio.create_task(_heartbeats())
        try:
            return await self._collect(request)
        finally:
            beating.cancel()

    async def _collect(self, request: GarbageCollectionRequest) -> GarbageCollectionResult:
        await self._cache_ready()
        try:
            listed = await self.ec2.command_launches()
        except Exception as err:
            raise classify_ec2(err, "listing this cluster's instances launched for commands") from None
        now = self._now()
        launches = [launch for launch in (launch_of(i, self.cluster) for i in listed) if launch is not None]
        if stale := self.cache.stale():  # the listing took long: the cache must still be current
            raise retryable(
                f"the cluster cache is stale, no collection on it: {'; '.join(stale)}", errors.STALE_VIEW
            )
        grace = timedelta(seconds=request.grace_seconds)
        ttl = timedelta(seconds=request.registration_ttl_seconds)
        suspects = [
            found
            for launch in launches
            if (found := suspect(launch, self._cached_node(launch), now, grace, ttl)) is not None
        ]
        result = GarbageCollectionResult(at=now, instances=sum(1 for launch in launches if launch.live))
        if not suspects:
            return result
        states = await self._command_states({s.launch.command_id: s.launch for s in suspects})
        doomed = []
        for found in suspects:
            state, doubt = states[found.launch.command_id]
            if state == "closed":
                doomed.append(found)
            elif state == "unknown":
                result.in_doubt.append(f"{found.launch.instance_id} ({found.launch.command_id}): {doubt}")
        outcomes = await asyncio.gather(
            *(self._guarded(self._collect_one, s, now, grace, ttl) for s in doomed)
        )
        for found, (collected, problem) in zip(doomed, outcomes, strict=True):
            if collected is not None:
                result.collected.append(collected)
            if problem:
                result.problems.append(f"instance {found.launch.instance_id}: {problem}")
        if result.collected or result.problems or result.in_doubt:
            log.info(
                "garbage collection: %d collected, %d in doubt, %d problem(s)%s",
                len(result.collected),
                len(result.in_doubt),
                len(result.problems),
                "".join(f"; {p}" for p in result.problems),
            )
        return result

    async def _cache_ready(self) -> None:
        self.cache.start()  # a worker without the controller starts its cache with its first call
        if not await self.cache.wait_ready(SYNC_TIMEOUT):
            unsynced = ", ".join(self.cache.unsynced())
            raise retryable(f"the cluster cache has not listed {unsynced} yet", errors.STALE_VIEW)
        if stale := self.cache.stale():
            raise retryable(
                f"the cluster cache is stale, no collection on it: {'; '.join(stale)}", errors.STALE_VIEW
            )

    def _cached_node(self, launch: Launch) -> NodeFacts | None:
        node = self.cache.node_by_instance(launch.instance_id)
        return NodeFacts.of(node) if node is not None else None

    async def _guarded(self, step: Any, *args: Any) -> Any:
        async with self._slots:
            return await step(*args)

    # -- Temporal: is the command closed? -------------------------------------------------------------

    async def _command_states(self, commands: dict[str, Launch]) -> dict[str, tuple[CommandState, str]]:
        ids = list(commands)
        answers = await asyncio.gather(*(self._guarded(self._state_of, commands[c]) for c in ids))
        return dict(zip(ids, answers, strict=True))

    async def _state_of(self, launch: Launch) -> tuple[CommandState, str]:
        """Closed, open, or unknown (with why): a describe that fails never counts as closed."""
        try:
            described = await self.client.get_workflow_handle(launch.workflow_id).describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND and "namespace" not in err.message.lower():
                return command_state(False, False, "", "", launch.first_run_id), ""
            return "unknown", f"describing workflow {launch.workflow_id}: {err.status.name}: {err.message}"
        except Exception as err:
            return "unknown", f"describing workflow {launch.workflow_id}: {err!r}"
        running = described.status == WorkflowExecutionStatus.RUNNING
        first_run = described.raw_info.first_run_id if described.raw_info is not None else ""
        return command_state(True, running, described.run_id, first_run, launch.first_run_id), ""

    # -- acting on one instance -----------------------------------------------------------------------

    async def _collect_one(
        self, found: Suspect, now: datetime, grace: timedelta, ttl: timedelta
    ) -> tuple[CollectedInstance | None, str]:
        """Terminate the instance (if it still runs), then release its Node; (what was collected, a
        problem). The Node is read afresh first: one that initialized or was claimed since is kept."""
        launch, node = found.launch, found.node
        if node is not None:
            try:
                fresh = await self.kube.find_node(node.name)
            except Exception as err:
                return None, classify_kube(err, f"reading node {node.name}").message
            if fresh is not None and _uid(fresh) == node.uid:
                if suspect(launch, NodeFacts.of(fresh), now, grace, ttl) is None:
                    return None, ""  # it changed (initialized, claimed, deleting): not garbage now
                node = NodeFacts.of(fresh)
            else:
                node = None  # deleted meanwhile (the name may be another node's now)
        if not launch.live and node is None:
            return None, ""  # an ending instance whose Node is gone already: nothing left
        if launch.live:
            try:
                await self.ec2.terminate_instance(
                    InstanceRequest(instance_id=launch.instance_id, node=node.name if node else None)
                )
            except Exception as err:
                return None, classify_ec2(err, f"terminating instance {launch.instance_id}").message
            log.info(
                "garbage collection: terminated %s (%s): %s", launch.instance_id, launch.command_id, found.why
            )
            await self._count_disrupted(launch, found.reason, node)
            if node is None and (late := self.cache.node_by_instance(launch.instance_id)) is not None:
                # A Node that registered while the instance was judged: the cache shows it now.
                node = NodeFacts.of(late) if NodeFacts.of(late).releasable else None
        released, problem = await self._release(node) if node is not None else (False, "")
        collected = CollectedInstance(
            instance_id=launch.instance_id,
            nodepool=launch.nodepool,
            command_id=launch.command_id,
            reason=found.reason,
            node=node.name if released and node is not None else None,
            why=found.why,
        )
        done = ["terminated it"] if launch.live else []
        if released and node is not None:
            done.append(f"deleted its Node {node.name}")
        if done:
            await self._record(collected, node if released else None, " and ".join(done))
        return (collected if done else None), problem

    async def _release(self, node: NodeFacts) -> tuple[bool, str]:
        """Drop karpflow's finalizer and delete the Node, pinned to its UID and only while it is still
        releasable (never initialized, not deleting, held by no command)."""

        def mutate(current: Json) -> bool:
            if _uid(current) != node.uid or not NodeFacts.of(current).releasable:
                return False
            return drop_finalizer(current)

        try:
            after = await self.kube.update_node(node.name, mutate)
            if _uid(after) != node.uid or not NodeFacts.of(after).releasable:
                return False, f"node {node.name} changed since it was judged: left alone"
            await self.kube.delete_node(node.name, uid=node.uid)
        except KubeError as err:
            if not_found(err):
                return True, ""
            if err.status == 409:
                return False, f"node {node.name} is another node now: left alone"
            return False, classify_kube(err, f"deleting node {node.name}").message
        except Exception as err:
            return False, classify_kube(err, f"deleting node {node.name}").message
        log.info("garbage collection: deleted node %s", node.name)
        return True, ""

    async def _record(self, collected: CollectedInstance, node: NodeFacts | None, done: str) -> None:
        subjects = [self._nodepool_ref(collected.nodepool)]
        if node is not None:
            subjects.append(ObjectRef("Node", node.name, uid=node.uid))
        await events.record_all(
            self.events,
            [
                events.instance_garbage_collected(
                    subject, collected.instance_id, collected.command_id, collected.why, done
                )
                for subject in subjects
            ],
        )

    async def _count_disrupted(self, launch: Launch, reason: str, node: NodeFacts | None) -> None:
        """Karpenter's nodeclaims_disrupted and pods_disruption_initiated for a collected launch, as its
        NodeClaim garbage collection counts them (no consolidation policy; the termination mode of the
        pool's terminationGracePeriod; the Node's reschedulable pods, 0 when they cannot be listed)."""
        pool = self._nodepool(launch.nodepool)
        labels = disruption_labels(
            reason=reason,
            nodepool=launch.nodepool,
            capacity_type=launch.capacity_type,
            policy=None,
            grace=pool_termination_grace_period(pool) if pool is not None else None,
        )
        pods: list[Json] = []
        if node is not None:
            try:
                pods = await self.kube.pods_on_node(node.name)
            except Exception as err:
                log.info("garbage collection: listing the pods of node %s for a metric: %r", node.name, err)
        metrics.NODECLAIMS_DISRUPTED.labels(**labels).inc()
        metrics.PODS_DISRUPTION_INITIATED.labels(**labels).inc(reschedulable_pods(pods))

    def _nodepool(self, name: str) -> NodePool | None:
        """The cached NodePool as karpflow reads it; None when absent or invalid."""
        for raw in self.cache.objects_of("NodePool"):
            if (raw.get("metadata") or {}).get("name") == name:
                try:
                    return read_nodepool(raw)[0]
                except ValueError:
                    return None
        return None

    def _nodepool_ref(self, name: str) -> ObjectRef:
        for pool in self.cache.objects_of("NodePool"):
            if (pool.get("metadata") or {}).get("name") == name:
                return ObjectRef.of(pool, "NodePool", "karpenter.sh/v1")
        return ObjectRef("NodePool", name, api_version="karpenter.sh/v1")


def _uid(node: Json | None) -> str:
    return str(((node or {}).get("metadata") or {}).get("uid") or "")


async def _heartbeats(every: float = 5.0) -> None:
    """A collection of many instances waits on EC2 for minutes: say it is alive meanwhile."""
    while True:
        if activity.in_activity():
            activity.heartbeat()
        await asyncio.sleep(every)
