"""ControllerWorkflow: the singleton loop that makes karpflow act on its own.

One per cluster (`karpflow-controller/<cluster>`), kept running by every worker (started when
missing, failed or terminated; runtime/controller_start.py). A pass (karpenter-behavior.md §1):

1. observe and plan (activity `plan_pass`: the worker's informer cache, what is in flight from
   Temporal visibility, the planner, told which NodePools back off so their budget goes elsewhere);
2. crash cleanup: `karpenter.sh/disrupted` taints that no running workflow holds are removed;
3. the node annotations and NodePool finalizers the planner asks for are applied, and the
   `karpflow.io/leaving` taints of Optimal consolidation (`apply_taints`, behind the
   `leaving-taints` patch);
4. commands start as child DisruptionWorkflows (parent-close ABANDON: they outlive this run and
   any continue-as-new), with the planner's readable, deterministic id, so a replayed or repeated
   pass can never start one twice; a pass's commands start together, in one workflow task (behind
   `controller-concurrent-starts`: a drift batch is up to a hundred). Forceful commands start at once
   and ignore backoffs;
   consolidation commands wait on a durable timer (15 s) and start only if `validate_commands`
   still finds them valid on a fresh view (Karpenter's validation); drift starts at once;
5. every `gc_interval_seconds` (behind `controller-garbage-collection`), `collect_garbage` terminates
   karpflow's own launches whose command closed without them (activities/garbage_collection.py);
6. a NodePool whose voluntary commands failed backs off for that reason (1 min doubling to 10 min,
   with jitter), each failed run counted once, so one broken pool cannot starve the others.

It cannot die of what it meets: a failed activity is recorded in the status (`error`) and the
next pass runs; a signal whose input does not validate is dropped and listed (`bad_signals`).
It ends only when an operator stops it (`stop` signal, `karpflow controller stop`): it completes,
and completed is what the workers' supervision leaves alone.

The next pass follows at once when this one started something, else after the interval (or when
signalled `wake`). The run continues as new with its backoffs and unavailable offerings after
`passes_per_run` passes, or earlier when its history grows past `max_history_bytes` or
`max_history_events`, Temporal suggests it, or `max_open_children` of the commands it started still
run (Temporal refuses a run's 2,001st open child). Per-node reasons reach the workflow as changes
(api/node_reasons.py): they are in the status query, not repeated in every pass of the history.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, ClassVar

from temporalio import workflow
from temporalio.common import RawValue, SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    WorkflowAlreadyStartedError,
    is_cancelled_exception,
)

with workflow.unsafe.imports_passed_through():
    from api import node_reasons
    from api import search_attributes as sa
    from api.controller_io import (
        QUERY_PAUSES,
        QUERY_STATUS,
        SIGNAL_OFFERING_UNAVAILABLE,
        SIGNAL_STOP,
        SIGNAL_WAKE,
        UPDATE_PAUSE,
        UPDATE_RESUME,
        Backoff,
        ControllerInput,
        ControllerState,
        ControllerStatus,
        ControllerStopped,
        FailedCommand,
        HeldCommand,
        OfferingUnavailable,
        PassRequest,
        PassResult,
        Pause,
        PauseRequest,
        Pauses,
        PlannedCommand,
        StopRequest,
        ValidateRequest,
        Verdict,
    )
    from api.garbage_io import GarbageCollectionRequest, GarbageCollectionResult
    from api.rollout_io import RolloutInput
    from api.workflow_ids import drift_rollout_workflow_id
    from api.workflow_io import InvalidInput, parse_input
    from workflows.failures import one_line
    from workflows.options import (
        GARBAGE_COLLECTION_TIMEOUT,
        PASS_HEARTBEAT,
        PASS_RETRY,
        PASS_STEP,
        PASS_TIMEOUT,
    )
    from workflows.workflow_metrics import count_decision

# Visibility lists a started workflow within seconds (Elasticsearch refreshes each second); its nodes
# are held out of planning until then, and at most this long.
HOLD_AT_MOST = timedelta(minutes=2)
# A pass asks visibility for failed commands that closed up to this long before the previous pass, so
# one that visibility listed late is still seen; the runs already counted are skipped.
FAILURE_LOOKBACK = timedelta(minutes=2)
BAD_SIGNALS_KEPT = 20

# Changes to the command sequence, behind `workflow.patched` (docs/workflow-changes.md). Decided once
# at the start of a run: a run that began on older code keeps the older behaviour to its end.
PATCH_COUNT_FAILURES_ONCE = "controller-count-failures-once"
PATCH_BOUNDED_HISTORY = "controller-bounded-history"
PATCH_OPERATOR_CONTROLS = "controller-operator-controls"
PATCH_GARBAGE_COLLECTION = "controller-garbage-collection"
PATCH_CONCURRENT_STARTS = "controller-concurrent-starts"
# Issue 35: pools with a rollout policy drift in waves; the pass names the rollouts to start.
PATCH_DRIFT_ROLLOUTS = "controller-drift-rollouts"


# No failure_exception_types, on purpose: a bug in this code fails the workflow task, which is retried
# until fixed code runs it and carries on with the run's state. A failed run would be started again by
# the workers' supervision without its pauses, backoffs and unavailable offerings; a controller that
# retries starts nothing, and the supervision warns (runtime/controller_start.py; docs/workflow-changes.md,
# "When a workflow fails").
@workflow.defn(name="ControllerWorkflow")
class ControllerWorkflow:
    # Every activity it calls and every child it starts, in runbook order: the fault matrix's cells
    # (tests/unit/workflows/test_fault_matrix.py checks the lists against this module's code).
    ACTIVITIES: ClassVar[tuple[str, ...]] = (
        "plan_pass",
        "untaint_orphans",
        "sync_nodepool_finalizers",
        "apply_annotations",
        "sync_operator_controls",
        "apply_taints",
        "collect_garbage",
        "validate_commands",
    )
    CHILDREN: ClassVar[tuple[str, ...]] = ("DisruptionWorkflow", "RolloutWorkflow")

    @workflow.init
    def __init__(self, *args: Any) -> None:
        self._status = ControllerStatus()
        # The carried state is in place before any handler runs: a pause that arrives with the first
        # workflow task is kept, not overwritten when `run` starts. (A bad input: `run` fails it.)
        self._state = ControllerState()
        with contextlib.suppress(ApplicationError):
            self._state = self._input(args).state.model_copy(deep=True)
        self._woken = False
        self._stop: StopRequest | None = None
        self._bad_signals: list[str] = []
        # Every managed node's reason, for the status query; "" asks the next pass for all of them.
        self._reasons: dict[str, str] = {}
        self._reasons_fingerprint = ""
        self._count_failures_once = False
        self._bounded_history = False
        self._upkeep_controls = False
        self._collects_garbage = False
        self._concurrent_starts = False
        self._open_children = 0  # started by this run and still running

    @workflow.query(name=QUERY_STATUS)
    def status(self) -> ControllerStatus:
        return self._status.model_copy(
            update={
                "bad_signals": list(self._bad_signals),
                "stopping": self._stopping_text(),
                "pauses": self._pauses().pauses,
            }
        )

    @workflow.query
    def state(self) -> ControllerState:
        """What a run carries over: read from a run that ended by accident (failed, terminated) by the
        start of the next one, so its pauses and backoffs are not lost (runtime/controller_start.py)."""
        return self._state

    @workflow.query(name=QUERY_PAUSES)
    def pauses(self) -> Pauses:
        """The pauses in force, alone: what the interruption poller and the taint of a command started
        outside this controller read (activities/controls_gate.py), without the whole status."""
        return self._pauses()

    # -- updates: pause and resume (a bad request is rejected by the validator, before the history) --

    @workflow.update(name=UPDATE_PAUSE)
    def pause(self, *args: Any) -> Pauses:
        """Start no new command that the pause covers (globally, a NodePool, or an action); commands in
        flight finish. The pause becomes a window of every pass until `resume`: the nodes it holds
        back say so, and an expiration it holds back is soft, as under a MaintenanceWindow."""
        request = self._pause_request(UPDATE_PAUSE, args)
        self._state.pauses[request.key] = Pause(**request.model_dump(), since=workflow.now())
        workflow.logger.info("controller paused: %s", self._state.pauses[request.key].describe())
        return self._pauses()

    @pause.validator
    def _validate_pause(self, *args: Any) -> None:
        self._pause_request(UPDATE_PAUSE, args)

    @workflow.update(name=UPDATE_RESUME)
    def resume(self, *args: Any) -> Pauses:
        """Lift the pause of that scope; the next pass starts at once."""
        request = self._pause_request(UPDATE_RESUME, args)
        resumed = self._state.pauses.pop(request.key)
        workflow.logger.info("controller resumed: %s", resumed.describe())
        self._woken = True
        return self._pauses()

    @resume.validator
    def _validate_resume(self, *args: Any) -> None:
        request = self._pause_request(UPDATE_RESUME, args)
        if request.key not in self._state.pauses:
            held = ", ".join(sorted(self._state.pauses)) or "none"
            raise ApplicationError(f"resume: {request.key} is not paused (pauses in force: {held})")

    def _pause_request(self, name: str, args: tuple[Any, ...]) -> PauseRequest:
        if not args or args == (None,):
            return PauseRequest()
        if len(args) != 1:
            raise ApplicationError(f"{name}: takes one JSON object, got {len(args)} argument(s)")
        try:
            return parse_input(PauseRequest, args[0])
        except InvalidInput as err:
            raise ApplicationError(f"{name}: {err}") from None

    def _pauses(self) -> Pauses:
        return Pauses(pauses=sorted(self._state.pauses.values(), key=lambda p: p.key))

    # -- signals: every one takes any input, and a bad one is dropped, never raised -----------------
    # (A handler with fixed parameters fails the workflow task, forever, on a signal with one
    # argument too many; hence `*args`.)

    @workflow.signal(name=SIGNAL_WAKE)
    def wake(self, *args: Any) -> None:
        if args:
            self._drop_signal(SIGNAL_WAKE, f"takes no input, got {len(args)} argument(s)")
            return
        self._woken = True

    @workflow.signal(name=SIGNAL_OFFERING_UNAVAILABLE)
    def offering_unavailable(self, *args: Any) -> None:
        offering = self._signal_input(SIGNAL_OFFERING_UNAVAILABLE, OfferingUnavailable, args)
        if offering is None:
            return
        if offering.until.tzinfo is None:
            self._drop_signal(
                SIGNAL_OFFERING_UNAVAILABLE,
                f"until {offering.until.isoformat()} has no time zone (RFC 3339, e.g. 2025-01-31T12:00:00Z)",
            )
            return
        self._state.unavailable[offering.key] = offering
        self._woken = True

    @workflow.signal(name=SIGNAL_STOP)
    def stop(self, *args: Any) -> None:
        request = StopRequest() if not args or args == (None,) else None
        if request is None:
            request = self._signal_input(SIGNAL_STOP, StopRequest, args)
        if request is not None:
            self._stop = request

    @workflow.signal(dynamic=True)
    def unknown_signal(self, name: str, args: Sequence[RawValue]) -> None:
        known = ", ".join((SIGNAL_WAKE, SIGNAL_OFFERING_UNAVAILABLE, SIGNAL_STOP))
        self._drop_signal(name, f"no such signal (the controller takes {known})")

    def _signal_input(self, name: str, model: Any, args: tuple[Any, ...]) -> Any:
        if len(args) != 1:
            self._drop_signal(name, f"takes one JSON object, got {len(args)} argument(s)")
            return None
        try:
            return parse_input(model, args[0])
        except InvalidInput as err:
            self._drop_signal(name, str(err))
            return None

    def _drop_signal(self, name: str, why: str) -> None:
        text = f"{workflow.now().isoformat(timespec='seconds')} {name}: {why}"[:500]
        self._bad_signals = [*self._bad_signals, text][-BAD_SIGNALS_KEPT:]
        workflow.logger.warning("controller dropped signal %s", text)

    # -- the loop ------------------------------------------------------------------------------------

    @workflow.run
    async def run(self, *args: Any) -> ControllerStopped | None:
        request = self._input(args)
        self._status.cluster = request.cluster
        self._count_failures_once = workflow.patched(PATCH_COUNT_FAILURES_ONCE)
        self._bounded_history = workflow.patched(PATCH_BOUNDED_HISTORY)
        self._upkeep_controls = workflow.patched(PATCH_OPERATOR_CONTROLS)
        self._collects_garbage = workflow.patched(PATCH_GARBAGE_COLLECTION)
        self._concurrent_starts = workflow.patched(PATCH_CONCURRENT_STARTS)
        for _ in range(request.passes_per_run):
            if self._stop is not None:
                break
            started = await self._pass(request)
            if not started and self._stop is None:
                try:
                    interval = timedelta(seconds=request.interval_seconds)
                    await workflow.wait_condition(
                        lambda: self._woken or self._stop is not None, timeout=interval
                    )
                except TimeoutError:
                    pass
            self._woken = False
            if self._bounded_history and self._history_full(request):
                break
        # Signals that arrived during the last pass are in the state carried over.
        await workflow.wait_condition(workflow.all_handlers_finished)
        if self._stop is not None:
            workflow.logger.info("controller stopped: %s", self._stopping_text())
            return ControllerStopped(
                reason=self._stop.reason,
                by=self._stop.by,
                at=workflow.now(),
                passes=self._state.passes,
                state=self._state,  # for the run an operator starts next (runtime/controller_start.py)
            )
        workflow.continue_as_new(request.model_copy(update={"state": self._state}))

    def _input(self, args: tuple[Any, ...]) -> ControllerInput:
        """Anyone may start the workflow by hand: a bad input fails it with the reason (and the
        workers' supervision starts a good one), never a workflow task that fails forever."""
        try:
            if len(args) != 1:
                raise InvalidInput(f"invalid ControllerInput: expected one JSON object, got {len(args)}")
            return parse_input(ControllerInput, args[0])
        except InvalidInput as err:
            raise ApplicationError(str(err), type="InvalidInput", non_retryable=True) from None

    def _history_full(self, request: ControllerInput) -> bool:
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_size() >= request.max_history_bytes
            or info.get_current_history_length() >= request.max_history_events
            or (self._concurrent_starts and self._open_children >= request.max_open_children)
        )

    def _stopping_text(self) -> str:
        if self._stop is None:
            return ""
        who = f" by {self._stop.by}" if self._stop.by else ""
        return f"stop requested{who}: {self._stop.reason or 'no reason given'}"

    # -- one pass --------------------------------------------------------------------------------------

    async def _pass(self, request: ControllerInput) -> bool:
        began = workflow.now()
        self._forget_expired(began)
        try:
            result: PassResult = await workflow.execute_activity(
                "plan_pass",
                self._pass_request(began),
                result_type=PassResult,
                start_to_close_timeout=PASS_TIMEOUT,
                heartbeat_timeout=PASS_HEARTBEAT,
                retry_policy=PASS_RETRY,
                summary=f"plan pass {self._state.passes + 1}",
            )
        except ActivityError as err:
            if is_cancelled_exception(err):
                raise
            self._status.error = f"planning failed: {one_line(err)}"
            workflow.logger.warning("controller pass failed: %s", self._status.error)
            return False
        self._state.passes += 1
        self._release_seen(result.in_flight, began)
        self._record_failures(request, self._new_failures(result), began)
        self._state.failures_seen_until = result.at
        waiting = self._take_reasons(result)

        errors: list[str] = []
        cleaned: list[str] = []
        if result.orphan_taints:
            cleaned = (
                await self._act(
                    "crash cleanup",
                    errors,
                    "untaint_orphans",
                    result.orphan_taints,
                    list[str],
                    summary=f"untaint {_count(result.orphan_taints, 'orphan node')}",
                )
                or []
            )
        if result.nodepool_finalizers:
            await self._act(
                "NodePool finalizers",
                errors,
                "sync_nodepool_finalizers",
                result.nodepool_finalizers,
                int,
                summary=f"finalizers of {_count(result.nodepool_finalizers, 'NodePool')}",
            )
        if result.annotations:
            await self._act(
                "node annotations",
                errors,
                "apply_annotations",
                result.annotations,
                int,
                summary=f"apply {_count(result.annotations, 'node annotation')}",
            )
        if result.upkeep is not None and self._upkeep_controls:
            # Valid conditions on MaintenanceWindows and NodeDisruptionBudgets, stale budget claims.
            await self._act(
                "operator controls",
                errors,
                "sync_operator_controls",
                result.upkeep,
                int,
                summary="operator controls: conditions and stale budget claims",
            )
        collected = await self._collect_garbage(request, began, errors)

        if result.taints and workflow.patched("leaving-taints"):
            # A hint to the kube-scheduler (planner/optimal/leaving.py): a failure is only logged.
            try:
                await workflow.execute_activity(
                    "apply_taints",
                    result.taints,
                    result_type=int,
                    start_to_close_timeout=PASS_STEP,
                    retry_policy=PASS_RETRY,
                    summary=f"leaving taints: {_count(result.taints, 'change')}",
                )
            except ActivityError as err:
                if is_cancelled_exception(err):
                    raise
                workflow.logger.warning("leaving taints not applied: %s", one_line(err))

        now, rejected, held_back = workflow.now(), {}, {}
        ready: list[PlannedCommand] = []
        to_validate: list[PlannedCommand] = []
        for command in result.commands:
            backoff = self._backoff_for(command, now)
            if backoff is not None:
                for node in command.nodes:
                    held_back[node] = (
                        f"NodePool {backoff.nodepool} backs off {backoff.reason} until {backoff.until}"
                    )
                continue
            (to_validate if command.needs_validation else ready).append(command)

        if result.rollouts and workflow.patched(PATCH_DRIFT_ROLLOUTS):
            await self._start_rollouts(request, result.rollouts)
        started = await self._start_all(request, ready)
        if to_validate:
            self._status.validating = [c.workflow_id for c in to_validate]
            await workflow.sleep(timedelta(seconds=request.validation_seconds))
            verdicts: list[Verdict] = []
            if self._stop is None:
                verdicts = (
                    await self._act(
                        "validation",
                        errors,
                        "validate_commands",
                        ValidateRequest(
                            commands=to_validate,
                            holding=self._held_nodes(),
                            pauses=list(self._state.pauses.values()),
                        ),
                        list[Verdict],
                        start_to_close_timeout=PASS_TIMEOUT,
                        heartbeat_timeout=PASS_HEARTBEAT,
                        summary=f"validate {_count(to_validate, 'command')}",
                    )
                    or []
                )
            self._status.validating = []
            valid: list[PlannedCommand] = []
            for verdict in verdicts:
                if not verdict.valid or verdict.command is None:
                    rejected[verdict.workflow_id] = verdict.reason
                else:
                    valid.append(verdict.command)
            started.extend(await self._start_all(request, valid))
        started_ids = [s for s in started if s]

        info = workflow.info()
        self._status = ControllerStatus(
            cluster=request.cluster,
            passes=self._state.passes,
            last_pass_at=began,
            last_pass_seconds=round((workflow.now() - began).total_seconds(), 3),
            last_pass_nodes=result.nodes,
            started=started_ids,
            rejected=rejected,
            blocked={**self._reasons, **held_back},
            budgets=result.budgets,
            in_flight=result.in_flight,
            backoffs=sorted(self._state.backoffs.values(), key=lambda b: (b.nodepool, b.reason)),
            unavailable=list(self._state.unavailable.values()),
            cleaned_taints=cleaned,
            problems=result.problems,
            breaker=result.breaker,
            waiting=waiting,
            quiet=not result.commands
            and not result.in_flight
            and not waiting
            and not cleaned
            and not collected
            and not errors,
            error="; ".join(errors),
            history_events=info.get_current_history_length(),
            history_bytes=info.get_current_history_size(),
            garbage=self._state.garbage,
        )
        return bool(started_ids)

    async def _collect_garbage(self, request: ControllerInput, now: datetime, errors: list[str]) -> int:
        """Every `gc_interval_seconds` (the first pass of a chain included): terminate the launches of
        closed commands (activities/garbage_collection.py). Returns how many it collected."""
        last = self._state.garbage_collected_at
        interval = timedelta(seconds=request.gc_interval_seconds)
        if not self._collects_garbage or not interval or (last is not None and now - last < interval):
            return 0
        self._state.garbage_collected_at = now  # a failed collection waits for the next interval too
        result: GarbageCollectionResult | None = await self._act(
            "garbage collection",
            errors,
            "collect_garbage",
            GarbageCollectionRequest(
                grace_seconds=request.gc_grace_seconds,
                registration_ttl_seconds=request.gc_registration_ttl_seconds,
            ),
            GarbageCollectionResult,
            start_to_close_timeout=GARBAGE_COLLECTION_TIMEOUT,
            heartbeat_timeout=PASS_HEARTBEAT,
            summary="garbage collection: launches of closed commands",
        )
        if result is None:
            return 0
        self._state.garbage = result.bounded()
        return len(result.collected)

    async def _act(
        self,
        what: str,
        errors: list[str],
        activity: str,
        arg: Any,
        result_type: type,
        *,
        start_to_close_timeout: timedelta | None = None,
        heartbeat_timeout: timedelta | None = None,
        summary: str | None = None,
    ) -> Any:
        """One of the pass's own activities; a failure is recorded and the pass goes on (the next
        pass sees the cluster again and plans what is still needed)."""
        try:
            return await workflow.execute_activity(
                activity,
                arg,
                result_type=result_type,
                start_to_close_timeout=start_to_close_timeout or PASS_STEP,
                heartbeat_timeout=heartbeat_timeout,
                retry_policy=PASS_RETRY,
                summary=summary,
            )
        except ActivityError as err:
            if is_cancelled_exception(err):
                raise
            errors.append(f"{what} failed: {one_line(err)}")
            workflow.logger.warning("controller: %s", errors[-1])
            return None

    def _pass_request(self, now: datetime) -> PassRequest:
        since = self._state.failures_seen_until
        if self._count_failures_once and since is not None:
            since -= FAILURE_LOOKBACK
        return PassRequest(
            holding=self._held_nodes(),
            unavailable=list(self._state.unavailable.values()),
            failures_since=since,
            counted_failures=sorted(self._state.counted_failures),
            backoffs=sorted(
                (b for b in self._state.backoffs.values() if b.until > now),
                key=lambda b: (b.nodepool, b.reason),
            ),
            reasons_base=self._reasons_fingerprint,
            pauses=list(self._state.pauses.values()),
        )

    def _take_reasons(self, result: PassResult) -> list[str]:
        """Apply the pass's reasons to the ones held; returns the nodes only waiting."""
        if result.reasons is None:  # a worker of the previous version: every reason, every pass
            self._reasons, self._reasons_fingerprint = dict(result.blocked), ""
            return list(result.waiting)
        update = result.reasons
        if update.base and update.base != self._reasons_fingerprint:
            self._reasons_fingerprint = ""  # not ours to apply: the next pass sends every reason
        else:
            self._reasons = node_reasons.apply(self._reasons, update)
            held = node_reasons.fingerprint(self._reasons)
            self._reasons_fingerprint = held if held == update.fingerprint else ""
        return node_reasons.waiting(self._reasons)

    async def _start_all(self, request: ControllerInput, commands: list[PlannedCommand]) -> list[str | None]:
        """Start the commands: together, in one workflow task (a pass's drift batch is many: one
        after another, each waited for, cost a workflow task and three events more each); before
        `controller-concurrent-starts`, one after another. None for one already started."""
        if not self._concurrent_starts:
            return [await self._start(request, c) for c in commands if self._stop is None]
        if self._stop is not None or not commands:
            return []
        return list(await asyncio.gather(*(self._start(request, c) for c in commands)))

    async def _start(self, request: ControllerInput, command: PlannedCommand) -> str | None:
        """Start the command's DisruptionWorkflow; its id makes a second start a no-op. Its nodes are
        searchable from the start and held out of the next passes until visibility lists it; the Web
        UI shows its summary, details and memo (what started it, why, the estimated savings)."""
        try:
            handle = await workflow.start_child_workflow(
                "DisruptionWorkflow",
                command.input,
                id=command.workflow_id,
                task_queue=request.task_queue,
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                search_attributes=TypedSearchAttributes(
                    [
                        SearchAttributePair(sa.NODES, sa.nodes_value(list(command.nodes))),
                        SearchAttributePair(sa.REASON, command.reason),
                        SearchAttributePair(sa.NODEPOOL, ",".join(command.nodepools)),
                    ]
                ),
                memo=command.memo or None,
                static_summary=command.summary or None,
                static_details=command.details or None,
            )
        except WorkflowAlreadyStartedError:
            return None
        if not command.forceful:  # Karpenter counts voluntary decisions only
            decision = command.decision or ("replace" if command.input.get("replacements") else "delete")
            count_decision(decision, command.reason, command.consolidation_type)
        # The outcome is read from visibility by a later pass; reading it here too keeps a failed
        # child from being logged as an exception nobody retrieved, and says in one line why.
        handle.add_done_callback(_log_outcome)
        self._open_children += 1
        handle.add_done_callback(self._child_closed)
        held = HeldCommand(nodes=list(command.nodes), since=workflow.now())
        self._state.holding[command.workflow_id] = held
        workflow.logger.info(
            "started %s (%s %s)", command.workflow_id, command.reason, ", ".join(command.nodes)
        )
        return command.workflow_id

    async def _start_rollouts(self, request: ControllerInput, rollouts: list[RolloutInput]) -> None:
        """Start each pool's drift rollout (workflows/rollout_waves.py), abandoned like every command:
        it outlives this run. Its id is the pool's and target's, so one already running is left be."""
        for rollout in rollouts:
            workflow_id = drift_rollout_workflow_id(request.cluster, rollout.nodepool, rollout.target)
            try:
                await workflow.start_child_workflow(
                    "RolloutWorkflow",
                    rollout.model_dump(mode="json"),
                    id=workflow_id,
                    task_queue=request.task_queue,
                    parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                    static_summary=f"drift rollout of {rollout.nodepool} toward {rollout.target}",
                )
            except WorkflowAlreadyStartedError:
                continue
            workflow.logger.info("started %s (%d drifted node(s))", workflow_id, rollout.total)

    def _child_closed(self, _handle: Any) -> None:
        self._open_children -= 1

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

    def _new_failures(self, result: PassResult) -> list[FailedCommand]:
        """The failed commands not counted yet. A pass looks back past the previous one (visibility
        may list a closed workflow late), so the same run can come back; it counts once."""
        if not self._count_failures_once:
            return result.failed
        counted = self._state.counted_failures
        fresh = []
        for failure in result.failed:
            key = failure.key
            if key not in counted:
                counted[key] = failure.closed_at
                fresh.append(failure)
        # What the next pass's look-back can no longer list need not be remembered.
        horizon = result.at - FAILURE_LOOKBACK
        self._state.counted_failures = {k: at for k, at in counted.items() if at > horizon}
        return fresh

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
                    last_failure=f"{failure.workflow_id}: {failure.message}"
                    if failure.message
                    else failure.workflow_id,
                )

    def _forget_expired(self, now: datetime) -> None:
        self._state.unavailable = {k: u for k, u in self._state.unavailable.items() if u.until > now}
        # A backoff that ran out is kept (its failure count doubles the next delay) for one more hour.
        self._state.backoffs = {
            k: b for k, b in self._state.backoffs.items() if b.until + timedelta(hours=1) > now
        }


def _count(items: Any, noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def _log_outcome(handle: Any) -> None:
    if handle.cancelled():
        return
    err = handle.exception()
    if err is not None:
        workflow.logger.info("command %s failed: %s", handle.id, one_line(err))
