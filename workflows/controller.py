"""ControllerWorkflow: the singleton loop that makes karpflow act on its own.

One per cluster (`karpflow-controller/<cluster>`), started idempotently by every worker. A pass
(karpenter-behavior.md §1):

1. observe and plan (activity `plan_pass`: the worker's informer cache, what is in flight from
   Temporal visibility, the planner);
2. crash cleanup: `karpenter.sh/disrupted` taints that no running workflow holds are removed;
3. the node annotations the planner asks for are applied, and the `karpflow.io/leaving` taints of
   Optimal consolidation (`apply_taints`, behind the `leaving-taints` patch);
4. commands start as child DisruptionWorkflows (parent-close ABANDON: they outlive this run and
   any continue-as-new), with the planner's readable, deterministic id, so a replayed or repeated
   pass can never start one twice. Forceful commands start at once and ignore backoffs;
   consolidation commands wait on a durable timer (15 s) and start only if `validate_commands`
   still finds them valid on a fresh view (Karpenter's validation); drift starts at once;
5. a NodePool whose voluntary commands failed backs off for that reason (1 min doubling to 10 min,
   with jitter), so one broken pool cannot starve the others.

The next pass follows at once when this one started something, else after the interval (or when
signalled `wake`). After `passes_per_run` passes the workflow continues as new with its backoffs
and unavailable offerings; a pass adds 10 to 30 events, so a run stays below about 3,000.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy, TypedSearchAttributes
from temporalio.exceptions import ActivityError, WorkflowAlreadyStartedError

with workflow.unsafe.imports_passed_through():
    from activities.errors import NON_RETRYABLE_TYPES
    from api import search_attributes as sa
    from api.controller_io import (
        SIGNAL_OFFERING_UNAVAILABLE,
        SIGNAL_WAKE,
        Backoff,
        ControllerInput,
        ControllerState,
        ControllerStatus,
        FailedCommand,
        HeldCommand,
        OfferingUnavailable,
        PassRequest,
        PassResult,
        PlannedCommand,
        ValidateRequest,
        Verdict,
    )
    from workflows.failures import activity_cause

PASS_TIMEOUT = timedelta(minutes=5)
PASS_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
    non_retryable_error_types=list(NON_RETRYABLE_TYPES),
)
# Planning heartbeats (activities/planning.py): a pass lost with its worker is retried within this.
PASS_HEARTBEAT = timedelta(seconds=30)
# Visibility lists a started workflow within seconds (Elasticsearch refreshes each second); its nodes
# are held out of planning until then, and at most this long.
HOLD_AT_MOST = timedelta(minutes=2)


@workflow.defn(name="ControllerWorkflow")
class ControllerWorkflow:
    def __init__(self) -> None:
        self._status = ControllerStatus()
        self._state = ControllerState()
        self._woken = False

    @workflow.query
    def status(self) -> ControllerStatus:
        return self._status

    @workflow.signal(name=SIGNAL_WAKE)
    def wake(self) -> None:
        self._woken = True

    @workflow.signal(name=SIGNAL_OFFERING_UNAVAILABLE)
    def offering_unavailable(self, offering: OfferingUnavailable) -> None:
        self._state.unavailable[offering.key] = offering
        self._woken = True

    @workflow.run
    async def run(self, request: ControllerInput) -> None:
        self._state = request.state.model_copy(deep=True)
        self._status.cluster = request.cluster
        for _ in range(request.passes_per_run):
            started = await self._pass(request)
            if not started:
                try:
                    interval = timedelta(seconds=request.interval_seconds)
                    await workflow.wait_condition(lambda: self._woken, timeout=interval)
                except TimeoutError:
                    pass
            self._woken = False
        # Signals that arrived during the last pass are in the state carried over.
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(request.model_copy(update={"state": self._state}))

    # -- one pass --------------------------------------------------------------------------------------

    async def _pass(self, request: ControllerInput) -> bool:
        began = workflow.now()
        self._forget_expired(began)
        try:
            result: PassResult = await workflow.execute_activity(
                "plan_pass",
                PassRequest(
                    holding=self._held_nodes(),
                    unavailable=list(self._state.unavailable.values()),
                    failures_since=self._state.failures_seen_until,
                ),
                result_type=PassResult,
                start_to_close_timeout=PASS_TIMEOUT,
                heartbeat_timeout=PASS_HEARTBEAT,
                retry_policy=PASS_RETRY,
            )
        except ActivityError as err:
            self._status.error = f"planning failed: {activity_cause(err)}"
            workflow.logger.warning("controller pass failed: %s", self._status.error)
            return False
        self._state.passes += 1
        self._release_seen(result.in_flight, began)
        self._record_failures(request, result.failed, began)
        self._state.failures_seen_until = result.at

        cleaned: list[str] = []
        if result.orphan_taints:
            cleaned = await workflow.execute_activity(
                "untaint_orphans",
                result.orphan_taints,
                result_type=list[str],
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=PASS_RETRY,
            )
        if result.nodepool_finalizers:
            await workflow.execute_activity(
                "sync_nodepool_finalizers",
                result.nodepool_finalizers,
                result_type=int,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=PASS_RETRY,
            )
        if result.annotations:
            await workflow.execute_activity(
                "apply_annotations",
                result.annotations,
                result_type=int,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=PASS_RETRY,
            )

        if result.taints and workflow.patched("leaving-taints"):
            # A hint to the kube-scheduler (planner/optimal/leaving.py): a failure must not stop the pass.
            try:
                await workflow.execute_activity(
                    "apply_taints",
                    result.taints,
                    result_type=int,
                    start_to_close_timeout=timedelta(seconds=30),
                    retry_policy=PASS_RETRY,
                )
            except ActivityError as err:
                workflow.logger.warning("leaving taints not applied: %s", activity_cause(err))

        now, rejected, blocked = workflow.now(), {}, dict(result.blocked)
        ready, to_validate = [], []
        for command in result.commands:
            backoff = self._backoff_for(command, now)
            if backoff is not None:
                for node in command.nodes:
                    blocked[node] = (
                        f"NodePool {backoff.nodepool} backs off {backoff.reason} until {backoff.until}"
                    )
                continue
            (to_validate if command.needs_validation else ready).append(command)

        started = [await self._start(request, c) for c in ready]
        if to_validate:
            self._status.validating = [c.workflow_id for c in to_validate]
            await workflow.sleep(timedelta(seconds=request.validation_seconds))
            verdicts: list[Verdict] = await workflow.execute_activity(
                "validate_commands",
                ValidateRequest(commands=to_validate, holding=self._held_nodes()),
                result_type=list[Verdict],
                start_to_close_timeout=PASS_TIMEOUT,
                heartbeat_timeout=PASS_HEARTBEAT,
                retry_policy=PASS_RETRY,
            )
            self._status.validating = []
            for verdict in verdicts:
                if verdict.valid and verdict.command is not None:
                    started.append(await self._start(request, verdict.command))
                else:
                    rejected[verdict.workflow_id] = verdict.reason
        started_ids = [s for s in started if s]

        self._status = ControllerStatus(
            cluster=request.cluster,
            passes=self._state.passes,
            last_pass_at=began,
            last_pass_seconds=round((workflow.now() - began).total_seconds(), 3),
            last_pass_nodes=result.nodes,
            started=started_ids,
            rejected=rejected,
            blocked=blocked,
            budgets=result.budgets,
            in_flight=result.in_flight,
            backoffs=sorted(self._state.backoffs.values(), key=lambda b: (b.nodepool, b.reason)),
            unavailable=list(self._state.unavailable.values()),
            cleaned_taints=cleaned,
            problems=result.problems,
            waiting=result.waiting,
            quiet=not result.commands and not result.in_flight and not result.waiting and not cleaned,
        )
        return bool(started_ids)

    async def _start(self, request: ControllerInput, command: PlannedCommand) -> str | None:
        """Start the command's DisruptionWorkflow; its id makes a second start a no-op. Its nodes are
        searchable from the start and held out of the next passes until visibility lists it."""
        try:
            await workflow.start_child_workflow(
                "DisruptionWorkflow",
                command.input,
                id=command.workflow_id,
                task_queue=request.task_queue,
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                search_attributes=TypedSearchAttributes(
                    [
                        sa.NODES.value_set(list(command.nodes)),
                        sa.REASON.value_set(command.reason),
                        sa.NODEPOOL.value_set(",".join(command.nodepools)),
                    ]
                ),
            )
        except WorkflowAlreadyStartedError:
            return None
        held = HeldCommand(nodes=list(command.nodes), since=workflow.now())
        self._state.holding[command.workflow_id] = held
        workflow.logger.info(
            "started %s (%s %s)", command.workflow_id, command.reason, ", ".join(command.nodes)
        )
        return command.workflow_id

    # -- started, not yet visible ------------------------------------------------------------------------

    def _held_nodes(self) -> list[str]:
        return sorted({node for held in self._state.holding.values() for node in held.nodes})

    def _release_seen(self, in_flight: list[str], now: datetime) -> None:
        """Without the hold, a pass right after a start plans as if those nodes were still there to
        take pods, and two commands count on the same room (Karpenter marks them in its cluster
        state before the command runs)."""
        seen = set(in_flight)
        self._state.holding = {
            wid: held
            for wid, held in self._state.holding.items()
            if wid not in seen and held.since + HOLD_AT_MOST > now
        }

    # -- backoff -------------------------------------------------------------------------------------

    def _backoff_for(self, command: PlannedCommand, now: datetime) -> Backoff | None:
        if command.forceful:
            return None
        for pool in command.nodepools:
            backoff = self._state.backoffs.get(f"{pool}/{command.reason}")
            if backoff is not None and backoff.until > now:
                return backoff
        return None

    def _record_failures(self, request: ControllerInput, failed: list[FailedCommand], now: datetime) -> None:
        for failure in failed:
            for pool in failure.nodepools:
                key = f"{pool}/{failure.reason}"
                previous = self._state.backoffs.get(key)
                failures = previous.failures + 1 if previous is not None else 1
                delay = min(
                    request.backoff_initial_seconds * 2 ** (failures - 1), request.backoff_max_seconds
                )
                delay *= 0.8 + 0.4 * workflow.random().random()  # jitter: pools do not retry in step
                self._state.backoffs[key] = Backoff(
                    nodepool=pool,
                    reason=failure.reason,
                    failures=failures,
                    until=now + timedelta(seconds=delay),
                    last_failure=failure.workflow_id,
                )

    def _forget_expired(self, now: datetime) -> None:
        self._state.unavailable = {k: u for k, u in self._state.unavailable.items() if u.until > now}
        # A backoff that ran out is kept (its failure count doubles the next delay) for one more hour.
        self._state.backoffs = {
            k: b for k, b in self._state.backoffs.items() if b.until + timedelta(hours=1) > now
        }
