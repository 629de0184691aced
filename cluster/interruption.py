"""The interruption poller: EC2 events from SQS start the workflows that act on them (docs/interruption.md).

A task inside every worker process, like the node-deletion watcher, not a workflow: the durable
record is the SQS message itself, which is deleted only once its workflow has been started (or it
was found to need nothing), so a crash anywhere leaves it for redelivery. Exactly-once effect comes
from the workflow ids, derived from the instance id and the kind of event:
`interruption/<cluster>/<instance-id>/spot|rebalance` (reject duplicate: a redelivered or repeated
message starts nothing, even after the first run closed) and `termination/<cluster>/<node>/<uid>`
(the id every other part of karpflow uses for that node's termination). Every workflow is pinned to
the node's UID and carries its search attributes from the start.

At burst (hundreds of warnings at once, each repeated): messages are handled concurrently (bounded),
instance → node is read from the worker's informer cache, and a message whose workflow this process
already started, or is starting, is dropped before any Temporal call (an in-process memo; the
workflow ids and visibility stay the durable truth across processes).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from activities.controls_gate import ControlsGate, ControlsUnreadable, pause_windows
from activities.planning import without_offerings
from activities.recent_starts import recent_disruptions
from api import search_attributes as sa
from api.constants import (
    CAPACITY_RESERVATION_ID_LABEL,
    CAPACITY_TYPE_LABEL,
    INSTANCE_TYPE_LABEL,
    KARPENTER_GROUP,
    KARPENTER_VERSION,
    NODEPOOL_LABEL,
    ZONE_LABEL,
)
from api.controller_io import SIGNAL_OFFERING_UNAVAILABLE, OfferingUnavailable
from api.interruption_events import Interruption, UnparseableMessage, parse_message
from api.karpflow_overrides import REBALANCE_REPLACE
from api.workflow_ids import (
    InterruptionKind,
    controller_workflow_id,
    interruption_workflow_id,
    termination_workflow_id,
)
from api.workflow_io import DisruptionInput, Offering, ReplacementSpec, TerminationInput
from cluster.informer import ClusterCache
from kube import events
from kube.client import Json, KubeApi
from planner.catalog import Catalog, bundled_catalog
from planner.interruption import SpotReplacement, rebalance_block, spot_replacements
from planner.model import PlanOptions
from planner.operator_controls import with_outside_controls
from planner.rate_budgets import longest_period
from planner.snapshot import Snapshot
from runtime import metrics

log = logging.getLogger(__name__)

REBALANCE_ANNOTATION = REBALANCE_REPLACE
SPOT_WARNING = timedelta(minutes=2)  # a spot interruption happens two minutes after its warning
# (an interruptible capacity reservation's too). Their workflow ids are never reused.
# A capacity block's instances begin to terminate ten minutes after its expiration warning.
CAPACITY_BLOCK_WARNING = timedelta(minutes=10)
# What a reclaiming warning starts: (workflow id kind, how long until EC2 takes the instance).
RECLAIMING: dict[str, tuple[InterruptionKind, timedelta]] = {
    "SpotInterruption": ("spot", SPOT_WARNING),
    "CapacityReservationInterruption": ("capacity-reservation", SPOT_WARNING),
    "CapacityBlockExpiration": ("capacity-block-expiration", CAPACITY_BLOCK_WARNING),
}
REJECT_DUPLICATE_KINDS = (*RECLAIMING, "RebalanceRecommendation")
UNAVAILABLE_FOR = timedelta(minutes=3)  # Karpenter's unavailable-offerings cache TTL
# Seconds a node listing serves; short, since a message for a node that just joined must find it
# (a miss is a no-op, deleted), and any action is idempotent by workflow id anyway.
NODE_INDEX_TTL = 1.0
CACHE_WAIT = 5.0  # seconds a message waits for the informer cache's first listing
STARTED_MEMO = 100_000  # workflow ids remembered as started by this process (oldest forgotten first)
# Latencies kept for benches and tests: the latest ones (the histogram metric has them all).
LATENCY_SAMPLES = 10_000


def _nodepool(node: Json) -> str | None:
    return ((node.get("metadata") or {}).get("labels") or {}).get(NODEPOOL_LABEL)


def instance_id_of(node: Json) -> str | None:
    provider = (node.get("spec") or {}).get("providerID") or ""
    return provider.rsplit("/", 1)[-1] if provider.startswith("aws://") else None


def offering_of(node: Json) -> tuple[str, str, str] | None:
    """(instance type, zone, capacity type) of the node, from its labels."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    if not labels.get(INSTANCE_TYPE_LABEL) or not labels.get(ZONE_LABEL):
        return None
    return labels[INSTANCE_TYPE_LABEL], labels[ZONE_LABEL], labels.get(CAPACITY_TYPE_LABEL) or "spot"


def fallback_replacement(node: Json) -> ReplacementSpec | None:
    """Without a view of the cluster (no informer cache): the same instance type in the same zone,
    where zone-pinned pods can follow, on-demand (the spot pool there is the one being reclaimed)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    pool, offering = labels.get(NODEPOOL_LABEL), offering_of(node)
    if not pool or offering is None:
        return None
    instance_type, zone, _ = offering
    return ReplacementSpec(
        nodepool=pool, offerings=[Offering(instance_type=instance_type, zone=zone, capacity_type="on-demand")]
    )


def replacement_specs(replacements: list[SpotReplacement]) -> list[ReplacementSpec]:
    return [
        ReplacementSpec(
            nodepool=r.nodepool,
            offerings=[
                Offering.model_validate({"instance_type": t, "zone": z, "capacity_type": c})
                for t, z, c in r.offerings
            ],
        )
        for r in replacements
    ]


class InterruptionPoller:
    def __init__(
        self,
        sqs: Any,
        queue: str,
        kube: KubeApi,
        client: Client,
        task_queue: str,
        cluster: str,
        concurrency: int = 50,
        wait_seconds: int = 20,
        fail_hook: Callable[[Interruption], None] | None = None,
        cache: ClusterCache | None = None,
        catalog: Catalog | None = None,
        options: PlanOptions | None = None,
    ) -> None:
        self.sqs = sqs
        # The planning options spot replacements are judged with (the worker's MinValuesPolicy).
        self.options = options
        # The worker's informer cache: the view the scheduling simulation and the budgets read.
        self.cache = cache
        self.catalog = catalog
        self.queue = queue
        self.kube = kube
        self.client = client
        self.task_queue = task_queue
        self.cluster = cluster
        self.wait_seconds = wait_seconds
        self.fail_hook = fail_hook  # tests: raise here to simulate a handler failure
        self.counters: Counter[str] = Counter()
        # Event time → workflow started, seconds: the latest LATENCY_SAMPLES (counters["acted"] counts
        # them all; the interruption_queue duration histogram is the metric of record).
        self.latencies: deque[float] = deque(maxlen=LATENCY_SAMPLES)
        self.last_poll = 0.0  # monotonic; a liveness heartbeat for /healthz-style checks
        self.concurrency = max(10, concurrency)
        # One thread per message in flight (its delete) plus the long poll.
        self._threads = ThreadPoolExecutor(self.concurrency + 1, thread_name_prefix="interruption-sqs")
        self._nodes: dict[str, Json] = {}
        self._nodes_at = float("-inf")
        self._nodes_lock = asyncio.Lock()
        self._snapshot: Snapshot | None = None
        self._snapshot_at = float("-inf")
        self._snapshot_lock = asyncio.Lock()
        # The controls outside the cluster (the controller's pauses, the starts rate budgets count),
        # read once per snapshot: a burst of recommendations queries the controller once.
        self.controls = ControlsGate(client, cluster, task_queue)
        self._controlled: tuple[Snapshot, Snapshot] | None = None  # (snapshot, its view with them)
        self._controlled_lock = asyncio.Lock()
        self._url: str | None = None
        # Workflow ids this process started (or found started), and those being started right now:
        # a repeated warning is dropped here, before the simulation, the signal and the Temporal call.
        self._started: OrderedDict[str, None] = OrderedDict()
        self._starting: dict[str, asyncio.Future[bool]] = {}

    async def queue_url(self) -> str:
        if self._url is None:
            if self.queue.startswith(("http://", "https://")):
                self._url = self.queue
            else:
                found = await self._sqs("get_queue_url", QueueName=self.queue)
                self._url = found["QueueUrl"]
        return self._url

    async def _sqs(self, method: str, **kwargs: Any) -> Any:
        """boto3 is blocking: its calls run on the poller's own threads, not the loop's default pool."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, lambda: getattr(self.sqs, method)(**kwargs))

    async def run(self) -> None:
        """Forever: long-poll up to 10 messages whenever 10 handler slots are free, handle each as a task
        of its own (a slow message does not hold up the next poll)."""
        backoff = 0.5
        inflight: set[asyncio.Task[None]] = set()
        try:
            while True:
                try:
                    while len(inflight) > self.concurrency - 10:
                        _, inflight = await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
                    url = await self.queue_url()
                    self.last_poll = time.monotonic()
                    response = await self._sqs(
                        "receive_message",
                        QueueUrl=url,
                        MaxNumberOfMessages=10,
                        WaitTimeSeconds=self.wait_seconds,
                    )
                    messages = response.get("Messages") or []
                    self.counters["received"] += len(messages)
                    for message in messages:
                        task = asyncio.create_task(self._guarded(url, message))
                        inflight.add(task)
                        task.add_done_callback(inflight.discard)
                    backoff = 0.5
                except asyncio.CancelledError:
                    raise
                except Exception as err:
                    log.warning("interruption poller: %r; polling again in %.1fs", err, backoff)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 30.0)
        finally:
            for task in inflight:
                task.cancel()
            self._threads.shutdown(wait=False, cancel_futures=True)

    async def _guarded(self, url: str, message: Json) -> None:
        try:
            await self.handle(message)
        except Exception as err:  # left in the queue: SQS redelivers it after its visibility timeout
            self.counters["failed"] += 1
            log.warning(
                "interruption message %s not handled, left for redelivery: %r", message.get("MessageId"), err
            )
            return
        await self._sqs("delete_message", QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        self.counters["deleted"] += 1
        metrics.INTERRUPTION_DELETED.inc()

    async def handle(self, message: Json) -> None:
        """Start what the message asks for; return normally when it may be deleted."""
        message_id = message.get("MessageId", "?")
        try:
            event = parse_message(message.get("Body") or "")
        except UnparseableMessage as err:
            self.counters["kind:Unparseable"] += 1
            metrics.INTERRUPTION_RECEIVED.labels(message_type="Unparseable").inc()
            log.warning("interruption message %s is unparseable, deleted: %s", message_id, err)
            return
        self.counters[f"kind:{event.kind}"] += 1
        metrics.INTERRUPTION_RECEIVED.labels(message_type=event.kind).inc()
        if event.kind == "Unknown":
            log.info("interruption message %s: %s is not acted on, deleted", message_id, event.description)
            return
        if self.fail_hook is not None:
            self.fail_hook(event)
        instance_ids = list(event.instance_ids)
        if event.reservation_id:  # a capacity block's warning: every node launched into it
            instance_ids = await self._instances_in_reservation(event.reservation_id)
        for instance_id in instance_ids:
            node = await self._node_of(instance_id)
            if node is None:
                self.counters["not_a_node"] += 1
                log.info(
                    "interruption message %s: %s %s is not a node of cluster %s, deleted",
                    message_id, event.kind, instance_id, self.cluster,
                )  # fmt: skip
                continue
            acted = await self._once(event, instance_id, node)
            if acted:
                latency = (datetime.now(UTC) - event.time).total_seconds()
                self.counters["acted"] += 1
                self.latencies.append(latency)
                metrics.INTERRUPTION_QUEUE_DURATION.observe(max(latency, 0.0))
                log.info(
                    "interruption %s of %s (node %s, message %s): %s, %.2fs after the event",
                    event.kind, instance_id, node["metadata"]["name"], message_id, acted, latency,
                )  # fmt: skip

    async def _node_of(self, instance_id: str) -> Json | None:
        """The node of this instance: from the informer cache when it has listed nodes, else (or for a
        node newer than a cache whose watch is not current) from a listing shared by the messages of
        one NODE_INDEX_TTL. A current cache's "no such node" is final: the queue carries the events of
        every instance in the account and region, most of them no node of this cluster, and a full
        listing of the nodes for each of them is what the cache is there to save; a node that
        registered within one watch delay of its own interruption warning is not one EC2 gives."""
        if self.cache is not None and await self.cache.wait_synced(CACHE_WAIT):
            node = self.cache.node_by_instance(instance_id)
            if node is not None or self.cache.current("Node") is not None:
                return node
        node = (await self._nodes_by_instance()).get(instance_id)
        if node is None:  # perhaps a node newer than the listing: look once more
            node = (await self._nodes_by_instance(max_age=0.1)).get(instance_id)
        return node

    def _workflow_id(self, event: Interruption, instance_id: str, node: Json) -> str:
        """The id of the workflow `_act` starts for this event (what makes a repeat a duplicate)."""
        if event.kind in RECLAIMING:
            return interruption_workflow_id(self.cluster, instance_id, RECLAIMING[event.kind][0])
        if event.kind == "RebalanceRecommendation":
            return interruption_workflow_id(self.cluster, instance_id, "rebalance")
        name, uid = node["metadata"]["name"], node["metadata"].get("uid") or ""
        return termination_workflow_id(self.cluster, name, uid or name)

    async def _once(self, event: Interruption, instance_id: str, node: Json) -> str:
        """`_act`, unless this process already started the workflow or is starting it: a repeat waits
        for the first message's outcome and is dropped (with the first one failed, it fails too and
        is left for redelivery)."""
        workflow_id = self._workflow_id(event, instance_id, node)
        if workflow_id in self._started:
            self.counters["duplicate"] += 1
            return ""
        starting = self._starting.get(workflow_id)
        if starting is not None:
            if not await asyncio.shield(starting):
                raise RuntimeError(f"{workflow_id}: its first message was not handled; left for redelivery")
            self.counters["duplicate"] += 1
            return ""
        starting = self._starting[workflow_id] = asyncio.get_running_loop().create_future()
        started = False
        try:
            acted = await self._act(event, instance_id, node)
            started = bool(acted)
            return acted
        finally:
            del self._starting[workflow_id]
            # A termination id may run again once closed (a later StateChange after a failed one);
            # an interruption id never does (REJECT_DUPLICATE): only those are remembered.
            if started and event.kind in REJECT_DUPLICATE_KINDS:
                self._started[workflow_id] = None
                while len(self._started) > STARTED_MEMO:
                    self._started.popitem(last=False)
            starting.set_result(started)

    async def _instances_in_reservation(self, reservation_id: str) -> list[str]:
        """The instances of this cluster's nodes labelled with the capacity reservation."""
        nodes = await self._nodes_by_instance(max_age=0.1)
        return sorted(
            instance
            for instance, node in nodes.items()
            if ((node.get("metadata") or {}).get("labels") or {}).get(CAPACITY_RESERVATION_ID_LABEL)
            == reservation_id
        )

    async def _nodes_by_instance(self, max_age: float = NODE_INDEX_TTL) -> dict[str, Json]:
        """Instance id → node. The API server is this cluster's: every node listed is ours. One listing
        serves every message handled in the same NODE_INDEX_TTL (a burst of warnings lists once)."""
        async with self._nodes_lock:
            if time.monotonic() - self._nodes_at > max_age:
                listing = await self.kube.list_nodes()
                self._nodes = {i: n for n in listing.get("items") or () if (i := instance_id_of(n))}
                self._nodes_at = time.monotonic()
            return self._nodes

    async def _act(self, event: Interruption, instance_id: str, node: Json) -> str:
        await self._record_event(node, event)
        name, uid = node["metadata"]["name"], node["metadata"].get("uid") or ""
        pins = {name: uid} if uid else {}
        provider_id = (node.get("spec") or {}).get("providerID")
        if event.kind in RECLAIMING:
            # EC2 takes the instance when the warning's time is up; Karpenter marks the spot offering,
            # or the reservation, unavailable (interruption/utils.go markUnavailableOfferings).
            kind, warning = RECLAIMING[event.kind]
            await self._offering_unavailable(node, instance_id)
            return await self._disruption(
                instance_id,
                kind,
                DisruptionInput(
                    reason="Interrupted",
                    nodes=[name],
                    node_uids=pins,
                    replacements=await self._replacements(node),
                    termination_deadline=event.time + warning,
                ),
                node,
            )
        if event.kind == "RebalanceRecommendation":
            if not await self._rebalance_opted_in(node):
                return ""
            # Voluntary: budgets, do-not-disrupt and rollback on a failed replacement apply.
            return await self._disruption(
                instance_id,
                "rebalance",
                DisruptionInput(
                    reason="Drifted",
                    nodes=[name],
                    node_uids=pins,
                    replacements=await self._replacements(node),
                ),
                node,
            )
        # StateChange, ScheduledChange: cordon, drain, terminate; the instance goes whatever happens.
        deadline = event.time if event.kind == "StateChange" else None
        self.counters["start_calls"] += 1
        handle = await self.client.start_workflow(
            "TerminationWorkflow",
            TerminationInput(
                node=name, uid=uid or None, reason="Interrupted", provider_id=provider_id, deadline=deadline
            ),
            id=termination_workflow_id(self.cluster, name, uid or name),
            task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            search_attributes=sa.at_start([name], "Interrupted", _nodepool(node)),
        )
        return f"termination {handle.id}"

    async def _disruption(
        self, instance_id: str, kind: InterruptionKind, command: DisruptionInput, node: Json
    ) -> str:
        workflow_id = interruption_workflow_id(self.cluster, instance_id, kind)
        self.counters["start_calls"] += 1
        try:
            await self.client.start_workflow(
                "DisruptionWorkflow",
                command,
                id=workflow_id,
                task_queue=self.task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                search_attributes=sa.at_start(command.nodes, command.reason, _nodepool(node)),
            )
        except WorkflowAlreadyStartedError:
            self.counters["duplicate"] += 1
            return f"{workflow_id} already started (duplicate)"
        return f"started {workflow_id}"

    async def _offering_unavailable(self, node: Json, instance_id: str) -> None:
        labels = (node.get("metadata") or {}).get("labels") or {}
        if not labels.get(INSTANCE_TYPE_LABEL) or not labels.get(ZONE_LABEL):
            return
        signal = OfferingUnavailable(
            instance_type=labels[INSTANCE_TYPE_LABEL],
            zone=labels[ZONE_LABEL],
            capacity_type=labels.get(CAPACITY_TYPE_LABEL) or "spot",
            until=datetime.now(UTC) + UNAVAILABLE_FOR,
            reason=f"interruption of {instance_id}",
        )
        handle = self.client.get_workflow_handle(controller_workflow_id(self.cluster))
        try:
            await handle.signal(SIGNAL_OFFERING_UNAVAILABLE, signal)
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            log.info("no controller workflow to tell that %s is unavailable (%s)", signal.key, err.message)

    async def _rebalance_opted_in(self, node: Json) -> bool:
        pool = ((node.get("metadata") or {}).get("labels") or {}).get(NODEPOOL_LABEL)
        if not pool:
            return False
        try:
            nodepool = await self.kube.get_cluster_custom(
                KARPENTER_GROUP, KARPENTER_VERSION, "nodepools", pool
            )
        except Exception as err:
            log.info("rebalance: NodePool %s not readable (%r): no proactive replacement", pool, err)
            return False
        annotations = (nodepool.get("metadata") or {}).get("annotations") or {}
        if annotations.get(REBALANCE_ANNOTATION) != "true":
            return False
        return await self._within_budget(pool, node)

    async def _within_budget(self, pool: str, node: Json) -> bool:
        """The gate a pass applies to a voluntary candidate (planner/interruption.py `rebalance_block`):
        MaintenanceWindows and the controller's pauses that block Rebalance, NodeDisruptionBudgets, the
        pool's budgets for reason Drifted (the reason the replacement runs under), rate budgets
        included. Without a view of the cluster, with budgets that cannot be read, or with pauses or
        starts that cannot be read, it fails closed (the taint checks them again)."""
        snapshot = await self.snapshot()
        if snapshot is None:
            log.info("rebalance: no view of the cluster yet: no proactive replacement in NodePool %s", pool)
            return False
        try:
            view = await self._with_controls(snapshot)
        except ControlsUnreadable as err:
            self.counters["rebalance_controls_unreadable"] += 1
            log.info("rebalance: %s: no proactive replacement in NodePool %s (fails closed)", err, pool)
            return False
        why = rebalance_block(view, node["metadata"]["name"])
        if why is not None:
            log.info("rebalance: %s: no proactive replacement", why)
        return why is None

    async def _with_controls(self, snapshot: Snapshot) -> Snapshot:
        """The snapshot with the controller's pauses as windows and, when a pool has a rate budget, the
        starts of its longest period: what a pass sees (activities/planning.py `_snapshot`)."""
        async with self._controlled_lock:
            if self._controlled is not None and self._controlled[0] is snapshot:
                return self._controlled[1]
            pauses = await self.controls.pauses()
            period = longest_period(snapshot.nodepools.values())
            recent = None
            if period is not None:
                starts = await self.controls.starts(snapshot.now - period)

                def pool_of(name: str) -> str | None:
                    known = snapshot.nodes.get(name)
                    return known.nodepool if known is not None else None

                recent = recent_disruptions(starts, pool_of)
            view = with_outside_controls(snapshot, pause_windows(pauses), recent)
            self._controlled = (snapshot, view)
            return view

    # -- the cluster as the planner sees it ---------------------------------------------------------

    async def snapshot(self) -> Snapshot | None:
        """The informer cache as a planner Snapshot (kept up to date from its events, so only what
        changed is parsed), shared by the messages of one NODE_INDEX_TTL; None without a cache, before
        it has synced, or while it is stale (no decision on a view that may have missed changes)."""
        if self.cache is None:
            return None
        async with self._snapshot_lock:
            if time.monotonic() - self._snapshot_at > NODE_INDEX_TTL:
                if not await self.cache.wait_synced(CACHE_WAIT):
                    return None
                if stale := self.cache.stale():
                    log.info("interruption: the cluster cache is stale (%s)", "; ".join(stale))
                    return None
                self._snapshot = await asyncio.to_thread(self.cache.snapshot, datetime.now(UTC))
                self._snapshot_at = time.monotonic()
            return self._snapshot

    async def _replacements(self, node: Json) -> list[ReplacementSpec]:
        """What the node's pods need once it is gone, from the planner's scheduling simulation on the
        informer cache, the node's own offering excluded (EC2 is reclaiming it, or warns it will)."""
        name = node["metadata"]["name"]
        snapshot = await self.snapshot()
        known = snapshot.nodes.get(name) if snapshot is not None else None
        if snapshot is None or known is None or known.uid != node["metadata"].get("uid"):
            spec = fallback_replacement(node)
            log.info("node %s: no current view of it in the cache; replacement %s", name, spec)
            return [spec] if spec else []
        reclaimed = offering_of(node)
        catalog = self._catalog(snapshot)
        if reclaimed is not None:
            gone = OfferingUnavailable(
                instance_type=reclaimed[0],
                zone=reclaimed[1],
                capacity_type=reclaimed[2],
                until=datetime.now(UTC) + UNAVAILABLE_FOR,
                reason=f"interruption of node {name}",
            )
            catalog = without_offerings(catalog, [gone], snapshot.now)
        replacements = await asyncio.to_thread(
            spot_replacements, snapshot, catalog, name, reclaimed, self.options
        )
        return replacement_specs(replacements)

    def _catalog(self, snapshot: Snapshot) -> Catalog:
        if self.catalog is None:
            self.catalog = bundled_catalog(snapshot.region() or "us-west-2")
        return self.catalog

    async def _record_event(self, node: Json, event: Interruption) -> None:
        """Karpenter's Event for the message on the node (kube/events.py; best effort)."""
        kind: str = event.kind  # state changes become StateChange:stopping|terminating
        if kind == "StateChange":
            kind = (
                "StateChange:stopping"
                if event.state in ("stopping", "stopped")
                else "StateChange:terminating"
            )
        recorded = events.interruption(node, kind)
        if recorded is not None:
            await events.recorder_for(self.kube).record(recorded)
