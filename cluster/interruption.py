"""The interruption poller: EC2 events from SQS start the workflows that act on them (docs/interruption.md).

A task inside every worker process, like the node-deletion watcher, not a workflow: the durable
record is the SQS message itself, which is deleted only once its workflow has been started (or it
was found to need nothing), so a crash anywhere leaves it for redelivery. Exactly-once effect comes
from the workflow ids, derived from the instance id: `interruption/<instance-id>` (reject duplicate:
a redelivered or repeated message starts nothing, even after the first run closed) and
`termination/<node>` (the id every other part of karpflow uses for a node's termination).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from api.constants import (
    CAPACITY_TYPE_LABEL,
    DISRUPTED_TAINT_KEY,
    INSTANCE_TYPE_LABEL,
    KARPENTER_GROUP,
    KARPENTER_VERSION,
    NODEPOOL_LABEL,
    ZONE_LABEL,
)
from api.controller_io import SIGNAL_OFFERING_UNAVAILABLE, OfferingUnavailable
from api.interruption_events import Interruption, UnparseableMessage, parse_message
from api.karpflow_overrides import REBALANCE_REPLACE, apply_disruption_overrides
from api.nodepool import NodePool
from api.workflow_ids import controller_workflow_id, interruption_workflow_id, termination_workflow_id
from api.workflow_io import DisruptionInput, ReplacementSpec, TerminationInput
from kube import events
from kube.client import Json, KubeApi
from planner.budgets import BudgetError, allowed_disruptions
from runtime import metrics

log = logging.getLogger(__name__)

REBALANCE_ANNOTATION = REBALANCE_REPLACE
SPOT_WARNING = timedelta(minutes=2)  # a spot interruption happens two minutes after its warning
UNAVAILABLE_FOR = timedelta(minutes=3)  # Karpenter's unavailable-offerings cache TTL
# Seconds a node listing serves; short, since a message for a node that just joined must find it
# (a miss is a no-op, deleted), and any action is idempotent by workflow id anyway.
NODE_INDEX_TTL = 1.0


def instance_id_of(node: Json) -> str | None:
    provider = (node.get("spec") or {}).get("providerID") or ""
    return provider.rsplit("/", 1)[-1] if provider.startswith("aws://") else None


def like_for_like(node: Json) -> ReplacementSpec | None:
    """The same NodePool, instance type and capacity type (on-demand as a fallback for spot)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    pool, instance_type = labels.get(NODEPOOL_LABEL), labels.get(INSTANCE_TYPE_LABEL)
    if not pool or not instance_type:
        return None
    capacity = labels.get(CAPACITY_TYPE_LABEL) or "on-demand"
    return ReplacementSpec(
        nodepool=pool,
        instance_types=[instance_type],
        capacity_type=["spot", "on-demand"] if capacity == "spot" else ["on-demand"],
    )


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
    ) -> None:
        self.sqs = sqs
        self.queue = queue
        self.kube = kube
        self.client = client
        self.task_queue = task_queue
        self.cluster = cluster
        self.wait_seconds = wait_seconds
        self.fail_hook = fail_hook  # tests: raise here to simulate a handler failure
        self.counters: Counter[str] = Counter()
        self.latencies: list[float] = []  # event time → workflow started, seconds
        self.last_poll = 0.0  # monotonic; a liveness heartbeat for /healthz-style checks
        self.concurrency = max(10, concurrency)
        # One thread per message in flight (its delete) plus the long poll.
        self._threads = ThreadPoolExecutor(self.concurrency + 1, thread_name_prefix="interruption-sqs")
        self._nodes: dict[str, Json] = {}
        self._nodes_at = float("-inf")
        self._nodes_lock = asyncio.Lock()
        self._url: str | None = None

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
        nodes = await self._nodes_by_instance()
        for instance_id in event.instance_ids:
            node = nodes.get(instance_id)
            if node is None:  # perhaps a node newer than the listing: look once more
                node = (await self._nodes_by_instance(max_age=0.1)).get(instance_id)
            if node is None:
                log.info(
                    "interruption message %s: %s %s is not a node of cluster %s, deleted",
                    message_id, event.kind, instance_id, self.cluster,
                )  # fmt: skip
                continue
            acted = await self._act(event, instance_id, node)
            if acted:
                latency = (datetime.now(UTC) - event.time).total_seconds()
                self.latencies.append(latency)
                metrics.INTERRUPTION_QUEUE_DURATION.observe(max(latency, 0.0))
                log.info(
                    "interruption %s of %s (node %s, message %s): %s, %.2fs after the event",
                    event.kind, instance_id, node["metadata"]["name"], message_id, acted, latency,
                )  # fmt: skip

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
        name = node["metadata"]["name"]
        provider_id = (node.get("spec") or {}).get("providerID")
        if event.kind == "SpotInterruption":
            await self._offering_unavailable(node, instance_id)
            spec = like_for_like(node)
            return await self._disruption(
                instance_id,
                DisruptionInput(
                    reason="Interrupted",
                    nodes=[name],
                    replacements=[spec] if spec else [],
                    termination_deadline=event.time + SPOT_WARNING,
                ),
            )
        if event.kind == "RebalanceRecommendation":
            if not await self._rebalance_opted_in(node):
                return ""
            spec = like_for_like(node)
            # Voluntary: budgets, do-not-disrupt and rollback on a failed replacement apply.
            return await self._disruption(
                instance_id,
                DisruptionInput(reason="Drifted", nodes=[name], replacements=[spec] if spec else []),
            )
        # StateChange, ScheduledChange: cordon, drain, terminate; the instance goes whatever happens.
        deadline = event.time if event.kind == "StateChange" else None
        handle = await self.client.start_workflow(
            "TerminationWorkflow",
            TerminationInput(node=name, reason="Interrupted", provider_id=provider_id, deadline=deadline),
            id=termination_workflow_id(name),
            task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        return f"termination {handle.id}"

    async def _disruption(self, instance_id: str, command: DisruptionInput) -> str:
        workflow_id = interruption_workflow_id(instance_id)
        try:
            await self.client.start_workflow(
                "DisruptionWorkflow",
                command,
                id=workflow_id,
                task_queue=self.task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
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
            reason=f"spot interruption of {instance_id}",
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
        return await self._within_budget(pool, nodepool)

    async def _within_budget(self, pool: str, nodepool: Json) -> bool:
        """The pool's budgets for reason Drifted (the reason the replacement runs under), minus the
        nodes of the pool already being disrupted or deleted; a budget that cannot be read fails closed."""
        members = [
            n
            for n in (await self._nodes_by_instance(max_age=0.1)).values()
            if ((n.get("metadata") or {}).get("labels") or {}).get(NODEPOOL_LABEL) == pool
        ]
        busy = sum(
            1
            for n in members
            if (n.get("metadata") or {}).get("deletionTimestamp")
            or any(t.get("key") == DISRUPTED_TAINT_KEY for t in (n.get("spec") or {}).get("taints") or ())
        )
        try:
            # karpflow.dev/budgets (running beside Karpenter) wins over spec, as in the planner.
            effective, problems = apply_disruption_overrides(nodepool)
            if problems:
                raise ValueError("; ".join(problems))
            allowed = allowed_disruptions(
                NodePool.model_validate(effective), len(members), datetime.now(UTC), "Drifted"
            )
        except (BudgetError, ValueError) as err:
            log.info("rebalance: budgets of NodePool %s unreadable (%s): no proactive replacement", pool, err)
            return False
        if allowed - busy <= 0:
            log.info("rebalance: NodePool %s budget allows no more disruptions now (%d busy)", pool, busy)
            return False
        return True

    async def _record_event(self, node: Json, event: Interruption) -> None:
        """Karpenter's Event for the message on the node (kube/events.py; best effort)."""
        kind = event.kind
        if kind == "StateChange":
            kind = (
                "StateChange:stopping"
                if event.state in ("stopping", "stopped")
                else "StateChange:terminating"
            )
        recorded = events.interruption(node, kind)
        if recorded is not None:
            await events.recorder_for(self.kube).record(recorded)
