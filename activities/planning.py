"""The ControllerWorkflow's eyes: observe the cluster, plan a pass, re-validate commands, clean up.

The planner (planner/) is pure; these activities give it a view of the cluster and of what is in
flight, and turn its commands into workflow inputs:

- the view is the worker's informer cache (cluster/informer.py), never a fresh list of every pod;
- what EC2NodeClass drift needs of the managed nodes' instances (AMI, subnet, security groups) comes
  from EC2, through a cache of DescribeInstances (activities/instance_descriptions.py), as Karpenter
  reads it from EC2 and not from any label;
- what is in flight comes from Temporal visibility (running DisruptionWorkflows and
  TerminationWorkflows, by their KarpflowNodes search attribute) plus the commands the controller
  holds for validation. Their nodes are shown to the planner as tainted `karpenter.sh/disrupted`
  (which is what they will be a moment later), so the planner's own rules exclude them from
  candidates and count them against budgets: a second worker, a restart or a visibility lag cannot
  make a pass exceed a budget or pick a node twice.

Planning is CPU work; it runs in a thread so the worker's event loop (heartbeats, watches) keeps
breathing. `plan_pass` and `validate_commands` heartbeat from start to end, waits for the cache
included, so a pass is retried elsewhere within the heartbeat timeout only when its worker is gone.

A pass result names every managed node's reason as changes against what the controller already
holds (api/node_reasons.py): the worker remembers what it last sent each controller.

The housekeeping a pass asks for (orphan taints, annotations, leaving taints, NodePool finalizers,
the operator's controls' conditions and stale claims) is done by the activities of
activities/controller_housekeeping.py, which PlanningActivities is composed with.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Collection, Iterable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio import activity
from temporalio.client import Client, WorkflowHistoryEventFilterType
from temporalio.service import RPCError

from activities import pass_report
from activities.capacity_reservations import CapacityReservationReader
from activities.controller_housekeeping import (
    ControllerHousekeeping,
    controls_upkeep,
    nodepool_finalizer_changes,
)
from activities.controls_gate import pause_windows
from activities.errors import STALE_VIEW, retryable
from activities.in_flight import InFlight, read_in_flight
from activities.instance_descriptions import InstanceDescriptions
from activities.recent_starts import recent_disruptions, recent_starts
from api import node_reasons
from api import search_attributes as sa
from api.constants import NODEPOOL_LABEL, disrupted_taint_key
from api.controller_io import (
    Backoff,
    FailedCommand,
    OfferingUnavailable,
    PassRequest,
    PassResult,
    Pause,
    PlannedCommand,
    ValidateRequest,
    Verdict,
)
from api.rollout_io import DriftRollout, RolloutInput
from api.workflow_io import VOLUNTARY_REASONS, Approval, disruption_input, disruption_workflow_id
from api.workflow_summaries import disruption_details, disruption_memo, disruption_summary
from cluster.informer import ClusterCache
from kube.client import Json, KubeApi
from kube.events import EventBatches, recorder_for
from planner import why_not
from planner.catalog import Catalog, bundled_catalog
from planner.model import (
    CONSOLIDATION_TYPE_OF,
    EMPTINESS,
    MULTI_NODE_CONSOLIDATION,
    OPTIMAL_CONSOLIDATION,
    SINGLE_NODE_CONSOLIDATION,
    PlanOptions,
)
from planner.operator_controls import with_outside_controls
from planner.pass_cache import PassCache
from planner.plan import CommandOut, command_out, plan, validate_command
from planner.rate_budgets import RecentDisruption, longest_period
from planner.reservations import with_reservations
from planner.snapshot import Snapshot, instance_id_of
from runtime import metrics

log = logging.getLogger(__name__)

SYNC_TIMEOUT = 60.0
# Karpenter validates consolidation commands (empty, multi, single) after a delay; drift and the
# forceful methods start at once.
VALIDATED_METHODS = frozenset(
    {EMPTINESS, MULTI_NODE_CONSOLIDATION, SINGLE_NODE_CONSOLIDATION, OPTIMAL_CONSOLIDATION}
)


# Temporal refuses a payload over 2 MB (and warns past 512 KB): a pass result carries commands up to
# this many bytes of JSON, in the plan's order; the rest wait for the next pass, which plans them
# again (a drift batch of 1,000 replacements is ~4 MB).
PASS_COMMAND_BYTES = 1_000_000

HEARTBEAT_EVERY = 5.0
# Controllers whose last sent reasons a worker remembers (one a cluster; a few for tests and moves).
REMEMBERED_CONTROLLERS = 8


@contextlib.asynccontextmanager
async def heartbeats() -> AsyncIterator[None]:
    """Heartbeat every HEARTBEAT_EVERY seconds while the block runs, whatever it awaits (the cache's
    first sync may take a minute; the heartbeat timeout is 30 s)."""
    if not activity.in_activity():
        yield
        return

    async def beat() -> None:
        while True:
            activity.heartbeat()
            await asyncio.sleep(HEARTBEAT_EVERY)

    beating = asyncio.create_task(beat(), name="planning-heartbeat")
    try:
        yield
    finally:
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating


def backed_off(backoffs: Iterable[Backoff], fresh: Iterable[FailedCommand], now: datetime) -> dict[str, str]:
    """'<pool>/<reason>' -> why: what the planner must leave to the other pools this pass. The
    controller's active backoffs, and the pools of failures it has not counted yet (it backs them off
    as soon as this pass returns)."""
    out = {}
    for failure in fresh:
        why = f": {failure.message}" if failure.message else ""
        for pool in failure.nodepools:
            out[f"{pool}/{failure.reason}"] = (
                f"NodePool {pool} backs off {failure.reason}: {failure.workflow_id} failed{why}"
            )
    for b in backoffs:
        if b.until > now:
            out[f"{b.nodepool}/{b.reason}"] = (
                f"NodePool {b.nodepool} backs off {b.reason} until {b.until.astimezone(UTC):%H:%M:%S} "
                f"after {b.failures} failed command(s)"
            )
    return out


FAILURE_TEXT_LIMIT = 300  # it travels in the pass result and the controller's backoffs


def failure_text(failure: Any) -> str:
    """A Temporal Failure (proto) as one line: its innermost cause with its type, e.g.
    `InstanceNotOwned: instance i-0abc is not tagged for cluster c` (the outer ones only wrap it:
    "Child Workflow execution failed", "Activity task failed")."""
    while failure.HasField("cause"):
        failure = failure.cause
    kind = failure.application_failure_info.type if failure.HasField("application_failure_info") else ""
    text = " ".join(failure.message.split())
    return (f"{kind}: {text}" if kind else text)[:FAILURE_TEXT_LIMIT]


def held_reason(reason: str, holder: tuple[str, str] | None) -> str:
    """The planner's reason for a node, naming the running workflow that holds it when one does
    (the planner only sees its taint), and the approval it waits for."""
    if holder is None or why_not.kind_of(reason) != why_not.Kind.IN_PROGRESS:
        return reason
    return why_not.in_flight_reason(*holder)


class SentReasons:
    """What this worker last sent each controller (by workflow id), to send only changes next time."""

    def __init__(self, remembered: int = REMEMBERED_CONTROLLERS) -> None:
        self._sent: OrderedDict[str, tuple[dict[str, str], str]] = OrderedDict()
        self._remembered = remembered

    def update(self, controller: str, base: str, reasons: dict[str, str]) -> node_reasons.ReasonsUpdate:
        """Changes only when the controller holds (by fingerprint `base`) what was sent last; else all."""
        sent, sent_fingerprint = self._sent.pop(controller, (None, ""))
        known = base and base == sent_fingerprint
        update = node_reasons.update_from(sent if known else None, reasons, sent_fingerprint if known else "")
        self._sent[controller] = (dict(reasons), update.fingerprint)
        while len(self._sent) > self._remembered:
            self._sent.popitem(last=False)
        return update


def planned_command(
    command: Any,
    cluster: str = "",
    started_by: str = "",
    recheck_every: timedelta | None = None,
    notify: bool = False,
) -> PlannedCommand:
    """A planner Command as the controller starts it: its workflow id (scoped by `cluster`) and input,
    its planned form, and what the Web UI shows of it (summary, details, memo naming `started_by`).
    `recheck_every`: how often it is judged again should it wait for approval."""
    planned = command_out(command).model_dump(mode="json", by_alias=True)
    workflow_input = disruption_input(command, planned=planned, recheck_every=recheck_every, notify=notify)
    return PlannedCommand(
        workflow_id=disruption_workflow_id(command, cluster),
        method=command.method,
        reason=command.reason,
        nodes=list(command.nodes),
        nodepools=list(command.nodepools),
        forceful=not workflow_input.voluntary,
        needs_validation=command.method in VALIDATED_METHODS,
        savings_per_hour=command.savings_per_hour,
        input=workflow_input.model_dump(mode="json"),
        planned=planned,
        decision=command.decision,
        consolidation_type=CONSOLIDATION_TYPE_OF.get(command.method, ""),
        summary=disruption_summary(command, workflow_input.approval),
        details=disruption_details(command, workflow_input.approval),
        memo=disruption_memo(command, started_by),
    )


def within_payload(
    commands: list[PlannedCommand], limit: int = PASS_COMMAND_BYTES
) -> tuple[list[PlannedCommand], str | None]:
    """The commands a pass result carries (the first ones, up to `limit` bytes of JSON; always the
    first), and what the result says of those left for the next pass (None: none left)."""
    total = 0
    for index, command in enumerate(commands):
        total += len(command.model_dump_json())
        if total > limit and index:
            left = len(commands) - index
            return commands[:index], (
                f"{left} command(s) of this pass wait for the next: a pass result carries at most "
                f"{limit:,} bytes of commands (Temporal's payload limit is 2 MB)"
            )
    return commands, None


def narrowed(command: PlannedCommand, out: CommandOut) -> PlannedCommand:
    """The command with the nodes validation kept (emptiness keeps the subset still valid), its input,
    planned form and what the Web UI shows following."""
    nodes = list(out.nodes)
    planned = out.model_dump(mode="json", by_alias=True)
    gate = command.input.get("approval")
    approval = Approval.model_validate(gate) if gate is not None else None
    workflow_input = {**command.input, "nodes": nodes}
    if approval is not None:
        approval = approval.model_copy(update={"planned": planned})
        workflow_input["approval"] = approval.model_dump(mode="json")
    return command.model_copy(
        update={
            "nodes": nodes,
            "input": workflow_input,
            "planned": planned,
            "savings_per_hour": out.savings_per_hour,
            "summary": disruption_summary(out, approval),
            "details": disruption_details(out, approval),
            "memo": {
                **command.memo,
                "nodes": nodes,
                "estimatedSavingsPerHour": round(out.savings_per_hour, 6),
            },
        }
    )


def controller_started_by(controller: str) -> str:
    """The memo's `command` of what the controller starts: the controller (its workflow id)."""
    return f"karpflow controller ({controller})" if controller else "karpflow controller"


def controller_id() -> str:
    """The workflow id of the controller this activity runs for."""
    return (activity.info().workflow_id or "") if activity.in_activity() else ""


class CacheNotSynced(RuntimeError):
    """Retryable: no decision before every kind has been listed once."""


def without_offerings(catalog: Catalog, unavailable: Iterable[OfferingUnavailable], now: datetime) -> Catalog:
    """The catalog with the offerings marked unavailable (e.g. a spot pool just interrupted)."""
    gone = {(u.instance_type, u.zone, u.capacity_type) for u in unavailable if u.until > now}
    if not gone:
        return catalog
    types = {}
    for name, kind in catalog.types.items():
        offerings = tuple(
            replace(o, available=False) if (name, o.zone, o.capacity_type) in gone else o
            for o in kind.offerings
        )
        types[name] = replace(kind, offerings=offerings) if offerings != kind.offerings else kind
    return Catalog(region=catalog.region, types=types, source=catalog.source)


class PlanningActivities(ControllerHousekeeping):
    """The controller's activities: `plan_pass` and `validate_commands` here, the housekeeping from
    ControllerHousekeeping."""

    def __init__(
        self,
        cache: ClusterCache,
        kube: KubeApi,
        client: Client,
        *,
        task_queue: str = "karpflow",
        region: str | None = None,
        options: PlanOptions | None = None,
        catalog: Catalog | None = None,
        cluster: str = "",
        instances: InstanceDescriptions | None = None,
        reservations: CapacityReservationReader | None = None,
        karpenter_coexistence: bool = False,
        approval_recheck: timedelta | None = None,
        notify: bool = False,
    ) -> None:
        self.cache = cache
        self.approval_recheck = approval_recheck  # a waiting command is judged again this often
        self.notify = notify  # the worker has a webhook: its commands tell it (workflows/notify.py)
        # The disruption taint karpflow writes, and so the only one its crash cleanup removes: beside
        # Karpenter, `karpenter.sh/disrupted` is Karpenter's, never karpflow's to take off.
        self.taint_key = disrupted_taint_key(karpenter_coexistence)
        self.cluster = cluster  # workflow ids carry it (api/workflow_ids.py)
        self.kube = kube
        self.client = client
        self.instances = instances
        self.reservations = reservations  # the EC2NodeClasses' capacity reservations (reserved offerings)
        self._reserved: tuple[Any, Catalog] | None = None  # the last catalog with them, while they hold
        self.task_queue = task_queue
        self.region = region
        self.options = options or PlanOptions()
        self._catalog = catalog
        self.sent_reasons = SentReasons()
        # Per-node work one pass hands the next (planner/pass_cache.py): the informer cache gives
        # each pass the same Pod objects for the pods that did not change.
        self.pass_cache = PassCache()
        # The pass's Events (none where a test plans without a Kubernetes API).
        self.events = EventBatches(recorder_for(kube)) if kube is not None else None

    # -- what is in flight ----------------------------------------------------------------------------

    async def _in_flight(self) -> InFlight:
        """Running disruption and termination workflows of this task queue (another cluster's worker
        may share the namespace), and the nodes they hold (with the phase each is in)."""
        return await read_in_flight(self.client, self.task_queue)

    async def _failed_since(
        self, since: datetime | None, counted: Collection[str] = ()
    ) -> list[FailedCommand]:
        if since is None:
            return []
        query = (
            "WorkflowType = 'DisruptionWorkflow' AND ExecutionStatus = 'Failed' "
            f"AND TaskQueue = '{self.task_queue}' "
            f"AND CloseTime > '{since.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%S.%fZ')}'"
        )
        failed = []
        async for execution in self.client.list_workflows(query):
            pools = (execution.typed_search_attributes.get(sa.NODEPOOL) or "").split(",")
            reason = execution.typed_search_attributes.get(sa.REASON) or ""
            if reason not in VOLUNTARY_REASONS:
                continue  # forceful commands are never held back
            failure = FailedCommand(
                workflow_id=execution.id,
                run_id=execution.run_id,
                nodepools=[p for p in pools if p],
                reason=reason,
                closed_at=execution.close_time or since,
            )
            if failure.key not in counted:  # read why once, when the controller first counts it
                failure.message = await self._failure_of(execution.id, execution.run_id)
            failed.append(failure)
        return failed

    async def _failure_of(self, workflow_id: str, run_id: str | None) -> str:
        """Why a closed workflow failed, as its close event says (the innermost cause, quoted); ""
        when it cannot be read (the backoff is decided anyway)."""
        try:
            handle = self.client.get_workflow_handle(workflow_id, run_id=run_id)
            async for event in handle.fetch_history_events(
                event_filter_type=WorkflowHistoryEventFilterType.CLOSE_EVENT
            ):
                if event.HasField("workflow_execution_failed_event_attributes"):
                    return failure_text(event.workflow_execution_failed_event_attributes.failure)
        except RPCError as err:
            log.info("cannot read why %s failed: %s", workflow_id, err)
        return ""

    # -- the view ------------------------------------------------------------------------------------

    async def _snapshot(
        self,
        held: set[str],
        now: datetime,
        pauses: Iterable[Pause] = (),
        holding: Iterable[str] = (),
        excluding: str = "",
    ) -> Snapshot:
        """The cached view, in-flight nodes tainted, the operator's pauses as windows, and the starts
        that rate budgets count (read from visibility only when a pool has a rate budget; `excluding`:
        a command judged again, whose own start is not one of them)."""
        self.cache.start()  # a worker without the controller starts its cache with its first pass
        if not await self.cache.wait_ready(SYNC_TIMEOUT):
            raise CacheNotSynced(f"the cluster cache has not listed {', '.join(self.cache.unsynced())} yet")
        if stale := self.cache.stale():
            raise retryable(f"the cluster cache is stale, no decision on it: {'; '.join(stale)}", STALE_VIEW)
        instances, problem = await self._instances(self.cache.objects_of("Node"))
        # Only what changed since the last pass is parsed (planner/snapshot_builder.py).
        snapshot = await asyncio.to_thread(self.cache.snapshot, now, instances, held)
        if problem:
            snapshot.problems.append(problem)
        period = longest_period(snapshot.nodepools.values())
        recent = None
        if period is not None:
            recent = await self._recent_disruptions(snapshot, now - period, holding, excluding)
        return with_outside_controls(snapshot, pause_windows(pauses), recent)

    async def _recent_disruptions(
        self, snapshot: Snapshot, since: datetime, holding: Iterable[str], excluding: str = ""
    ) -> list[RecentDisruption]:
        """Nodes whose disruption or termination started since `since` (Temporal visibility, read as
        activities/recent_starts.py says: a rolled-back, rejected or cancelled command took no node
        and is not counted), and the nodes of commands the controller started that visibility may
        not list yet. Each node once, at its earliest start."""
        starts = [
            s for s in await recent_starts(self.client, self.task_queue, since) if s.workflow_id != excluding
        ]

        def pool_of(node: str) -> str | None:
            known = snapshot.nodes.get(node)
            return known.nodepool if known is not None else None

        return recent_disruptions(starts, pool_of, holding, snapshot.now)

    async def _instances(self, nodes: list[Json]) -> tuple[list[dict[str, Any]], str | None]:
        """EC2's descriptions of the managed nodes' instances (none without an EC2 client)."""
        if self.instances is None:
            return [], None
        ids = [
            instance_id
            for obj in nodes
            if NODEPOOL_LABEL in ((obj.get("metadata") or {}).get("labels") or {})
            for instance_id in [instance_id_of((obj.get("spec") or {}).get("providerID"))]
            if instance_id
        ]
        # A cold cache describes every managed node (the activity heartbeats meanwhile).
        return await self.instances.describe(ids)

    async def _catalog_for(
        self, snapshot: Snapshot, unavailable: list[OfferingUnavailable], now: datetime
    ) -> Catalog:
        if self._catalog is None:
            self._catalog = bundled_catalog(self.region or snapshot.region() or "us-west-2")
        catalog = self._catalog
        if self.reservations is not None:
            reading = await self.reservations.by_nodeclass(snapshot.nodeclasses)
            # The same catalog object while the reading is the same: the simulation prepared for a
            # snapshot and catalog is reused by the pass's validation.
            key = (id(self._catalog), repr(sorted(reading.items())))
            if self._reserved is None or self._reserved[0] != key:
                self._reserved = (key, with_reservations(self._catalog, reading))
            catalog = self._reserved[1]
        return without_offerings(catalog, unavailable, now)

    # -- activities ----------------------------------------------------------------------------------

    @activity.defn(name="plan_pass")
    async def plan_pass(self, request: PassRequest) -> PassResult:
        """One pass of the planner on the cached view, with in-flight nodes held out and backed-off
        NodePools' budgets left to the others."""
        async with heartbeats():
            return await self._plan_pass(request)

    async def _plan_pass(self, request: PassRequest) -> PassResult:
        started = time.perf_counter()
        now = datetime.now(UTC)
        flying = await self._in_flight()
        held = flying.nodes | set(request.holding)
        counted = set(request.counted_failures)
        failed = await self._failed_since(request.failures_since, counted)
        fresh = [f for f in failed if f.key not in counted]
        snapshot = await self._snapshot(held, now, request.pauses, request.holding)
        catalog = await self._catalog_for(snapshot, request.unavailable, now)
        options = self.options.model_copy(update={"backed_off": backed_off(request.backoffs, fresh, now)})
        result = await asyncio.to_thread(plan, snapshot, catalog, options, cache=self.pass_cache)
        orphans = sorted(
            name
            for name, node in snapshot.nodes.items()
            if any(t.key == self.taint_key for t in node.taints) and not node.is_deleting and name not in held
        )
        started_by = controller_started_by(controller_id())
        commands, deferred = within_payload(
            [
                planned_command(command, self.cluster, started_by, self.approval_recheck, self.notify)
                for command in result.commands_
            ]
        )
        problems = [*result.problems, deferred] if deferred else result.problems
        finalizers = nodepool_finalizer_changes(snapshot)
        reasons = {b.node: held_reason(b.reason, flying.holders.get(b.node)) for b in result.blocked}
        seconds = round(time.perf_counter() - started, 3)
        pass_report.record_pass_metrics(result, reasons, seconds)
        if self.events is not None:
            self.events.submit(pass_report.pass_events(result, snapshot, reasons))
        self.cache.pass_planned()
        return PassResult(
            at=now,
            commands=commands,
            reasons=self.sent_reasons.update(controller_id(), request.reasons_base, reasons),
            budgets=result.budgets,
            problems=problems,
            breaker=result.breaker,
            in_flight=flying.ids,
            orphan_taints=orphans,
            annotations=[a.model_dump(mode="json") for a in result.annotations],
            taints=[t.model_dump(mode="json") for t in result.taints],
            nodepool_finalizers=finalizers,
            failed=failed,
            rollouts=[drift_rollout_input(r, self.cluster, now, self.notify) for r in result.rollouts],
            upkeep=controls_upkeep(self._controls_objects(), flying.ids, now),
            nodes=len(snapshot.nodes),
            pods=len(snapshot.pods),
            seconds=seconds,
        )

    def _controls_objects(self) -> list[Json]:
        # By kind: walking every cached object (pods too) cost a quarter second a pass at 5,000 nodes.
        return [
            obj
            for kind in ("MaintenanceWindow", "NodeDisruptionBudget", "Node")
            for obj in self.cache.objects_of(kind)
        ]

    @activity.defn(name="validate_commands")
    async def validate_commands(self, request: ValidateRequest) -> list[Verdict]:
        """Karpenter's validation: the commands, planned a while ago, re-checked on a fresh view."""
        async with heartbeats():
            return await self._validate_commands(request)

    async def _validate_commands(self, request: ValidateRequest) -> list[Verdict]:
        now = datetime.now(UTC)
        own = {n for c in request.commands for n in c.nodes}
        held = (await self._in_flight()).nodes | set(request.holding)
        snapshot = await self._snapshot(held - own, now, request.pauses, request.holding)
        catalog = await self._catalog_for(snapshot, [], now)
        verdicts = []
        starting: list[str] = []  # nodes of the commands of this batch found valid so far
        for command in request.commands:
            planned = CommandOut.model_validate(command.planned)
            out = await asyncio.to_thread(
                validate_command,
                snapshot,
                catalog,
                planned,
                self.options,
                marked=list(starting),
                cache=self.pass_cache,
            )
            if not out.valid or out.command is None:
                kind = command.consolidation_type or CONSOLIDATION_TYPE_OF.get(command.method, "")
                metrics.FAILED_VALIDATIONS.labels(consolidation_type=kind).inc()
                verdicts.append(Verdict(workflow_id=command.workflow_id, valid=False, reason=out.reason))
                continue
            starting.extend(out.command.nodes)
            still = command
            if out.command.nodes != planned.nodes:  # emptiness keeps the subset still valid
                # Everything of the command (id, pools, UIDs, approval, savings, what the Web UI
                # shows) from the one validated command, not from the planned one it was cut from.
                still = (
                    planned_command(
                        out.command_,
                        self.cluster,
                        controller_started_by(controller_id()),
                        self.approval_recheck,
                        self.notify,
                    )
                    if out.command_ is not None
                    else narrowed(command, out.command)
                )
            verdicts.append(Verdict(workflow_id=command.workflow_id, valid=True, command=still))
        return verdicts


def drift_rollout_input(rollout: DriftRollout, cluster: str, now: datetime, notify: bool) -> RolloutInput:
    """The RolloutWorkflow the controller starts for a pool's drift toward a new target. It polls a
    few times per soak (5 s to 30 s), so a failing gate is seen well before the soak ends."""
    poll = min(max(rollout.policy.soak / 8, timedelta(seconds=5)), timedelta(seconds=30))
    return RolloutInput(
        cluster=cluster,
        nodepool=rollout.nodepool,
        requested_at=now,
        requested_by="karpflow controller (drift)",
        poll_interval=poll,
        nodes=rollout.nodes,
        total=len(rollout.nodes),
        notify=notify,
        mode="drift",
        target=rollout.target,
        policy=rollout.policy,
    )
