"""DisruptionWorkflow: carry out one disruption command, or undo it.

The runbook (karpenter-behavior.md §3, with the durability Karpenter lacks):

1. Taint every candidate `karpenter.sh/disrupted:NoSchedule`. With replacements to launch, every
   candidate must be tainted or the command aborts (and rolls back).
2. Launch the replacements: offerings in price order; an offering out of capacity is remembered
   as unavailable (in workflow state, so durable) and the next one is tried.
3. Await each replacement: a Node with its providerID registers (labels, taints, finalizer
   synced), then initializes (Ready, no startup or ephemeral taint).
4. On failure or cancellation in 1-3, compensate: untaint the candidates, terminate the replacement
   instances that never initialized, then release their nodes. Replacements that did
   initialize stay as ordinary nodes: they are healthy capacity, and later consolidation may
   remove them; deleting them could evict pods that already moved there.
5. Start one TerminationWorkflow per candidate (`termination/<cluster>/<node>/<uid>`, the id the
   node-deletion watcher and the interruption handler use for the same node; parent-close ABANDON),
   which deletes the node and drains it. From here the command cannot be undone: a cancellation only
   stops this workflow from waiting; the terminations go on.

Candidates are pinned: to the UIDs in the input (the planner's), else to the nodes found when they
are tainted. A node that reuses a candidate's name later is another node: not tainted, untainted or
terminated by this command.

Forceful commands (expiration, repair, interruption, NodePool deletion; karpenter-behavior.md §7)
follow the same steps, but the candidates go whatever happens: a replacement that fails is discarded
and the candidates are terminated anyway. Karpenter leaves their capacity to its provisioner, and
their pods wait Pending meanwhile; here the replacements are bought ahead. They are waited for at
most `replacement_ready` before the drain starts, or, with a `termination_deadline` (a spot
interruption's two minutes), launched while the candidates drain at once. Standalone, nothing else
would provide for the displaced pods, so a replacement whose instance ends or whose node vanishes
after the launch is terminated, its offering remembered as unavailable, and the next offering
launched (PATCH_FORCEFUL_RELAUNCH: at most MAX_LAUNCHES, within the deadline); the status says
which launches failed and why, and, when none is left, that the command went without. With a
termination deadline, a candidate whose termination fails does not cut its replacements short: the
drained pods need them (PATCH_REPLACEMENTS_OUTLIVE); once the terminations are done, each
initialized replacement is looked at again, and one gone already is launched again
(PATCH_RECHECK_AFTER_DRAIN).

Beside Karpenter (--karpenter-coexistence; the resolved template says so), a replacement is a NodeClaim
karpflow creates and Karpenter launches, registers and initializes (step 3 reads its conditions); the
compensation deletes the NodeClaims of replacements that did not initialize, and Karpenter terminates
their instances. karpflow launches and terminates no instance of its own then (activities/nodeclaims.py).

History (behind PATCH_LEAN_HISTORY, issue 21): the short Kubernetes and EC2 calls (taint, resolve,
launch, create a NodeClaim, untaint, find and release, delete NodeClaims) are local activities, a
marker each inside the current workflow task; the waits (registration, initialization, NodeClaim
conditions, an instance's termination) stay regular activities, which heartbeat. The search
attributes are upserted in one call when the workflow is about to wait (a regular activity, the
approval, its children) or closes: the status query shows every phase as it happens.

This module is the runbook (`run`, the forceful path, the taint, the terminations), the queries and
updates, and how every step calls an activity and publishes its phase. The workflow class inherits
its other parts: the approval of a waiting command (disruption_approval.py), providing the
replacements (disruption_replacements.py), the compensation (disruption_rollback.py); what they
share is disruption_state.py, the patch ids disruption_patches.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar

from temporalio import workflow
from temporalio.common import SearchAttributeUpdate
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    ChildWorkflowError,
    WorkflowAlreadyStartedError,
    is_cancelled_exception,
)

with workflow.unsafe.imports_passed_through():
    from activities.kubernetes import KubernetesActivities
    from api import search_attributes as sa
    from api.activity_io import NodeRef, TaintRequest
    from api.notifications import Notification
    from api.workflow_ids import legacy_termination_workflow_id
    from api.workflow_io import (
        CandidateStatus,
        DisruptionInput,
        DisruptionPhase,
        DisruptionStatus,
        InvalidInput,
        ReplacementStatus,
        TerminationInput,
        parse_input,
    )
    from workflows.disruption_patches import (
        PATCH_APPROVAL_GATE,
        PATCH_CANCELED_PHASE,
        PATCH_DISCARD_ON_TERMINATION_FAILURE,
        PATCH_LEAN_HISTORY,
        PATCH_NOTIFY_FAILURE,
        PATCH_REPLACEMENTS_OUTLIVE,
        PATCH_TERMINATION_PER_INCARNATION,
    )
    from workflows.failures import WORKFLOW_BUGS, activity_cause, describe, is_bad_deploy
    from workflows.options import API_CALL, API_RETRY
    from workflows.termination import TerminationWorkflow
    from workflows.workflow_metrics import record_phase

from workflows.disruption_approval import DisruptionApproval
from workflows.disruption_replacements import DisruptionReplacements, ReplacementFailed
from workflows.disruption_rollback import DisruptionRollback
from workflows.disruption_state import DisruptionState, T, nodes_summary, through_cancellation
from workflows.notify import notify

HANDED_OVER = "canceled after the candidates were handed to their terminations, which go on"
# The phases a command closes in: upserted at once on the lean path (nothing is waited for after).
CLOSING_PHASES = frozenset({"Succeeded", "RolledBack", "Failed", "Canceled", "Rejected", "Invalidated"})
# Updates of a command that waits for approval (DisruptionInput.approval).
UPDATE_APPROVE = "approve"
UPDATE_REJECT = "reject"


# A bug in this code fails the run (after its compensation, when it came before the handover) rather
# than its workflow task for ever: a command is planned again, and a run that holds its candidates,
# budgets and claims while it retries helps nobody (docs/workflow-changes.md, "When a workflow fails").
@workflow.defn(name="DisruptionWorkflow", failure_exception_types=WORKFLOW_BUGS)
class DisruptionWorkflow(DisruptionApproval, DisruptionReplacements, DisruptionRollback):
    # Every activity it calls and every child it starts, in runbook order: the fault matrix's cells
    # (tests/unit/workflows/test_fault_matrix.py checks the lists against the code of this module and
    # of the parts it inherits).
    ACTIVITIES: ClassVar[tuple[str, ...]] = (
        "record_event",
        "check_waiting_command",
        "taint_disrupted",
        "resolve_replacement",
        "launch_instance",
        "await_node_registered",
        "await_node_initialized",
        "await_node_ready",
        "create_nodeclaim",
        "await_nodeclaim",
        "untaint_disrupted",
        "find_command_instances",
        "terminate_instance",
        "release_node",
        "delete_nodeclaims",
    )
    CHILDREN: ClassVar[tuple[str, ...]] = ("TerminationWorkflow", "NotificationWorkflow")

    @workflow.query
    def status(self) -> DisruptionStatus:
        return self._status

    @workflow.query
    def phase(self) -> str:
        return self._status.phase

    # -- approval (a NodePool's karpflow.dev/require-approval): validated updates; the wait for them
    # and the judgement of the waiting command again are disruption_approval.py's

    @workflow.update(name=UPDATE_APPROVE)
    def approve(self, *args: Any) -> DisruptionStatus:
        """Go on: the taint (which checks windows and NodeDisruptionBudgets again) comes next."""
        self._decision = (True, self._decision_input(UPDATE_APPROVE, args))
        return self._status

    @approve.validator
    def _validate_approve(self, *args: Any) -> None:
        self._decision_input(UPDATE_APPROVE, args)

    @workflow.update(name=UPDATE_REJECT)
    def reject(self, *args: Any) -> DisruptionStatus:
        """End the command with nothing changed."""
        self._decision = (False, self._decision_input(UPDATE_REJECT, args))
        return self._status

    @reject.validator
    def _validate_reject(self, *args: Any) -> None:
        self._decision_input(UPDATE_REJECT, args)

    @workflow.run
    async def run(self, raw: Any = None) -> DisruptionStatus:
        # `raw` defaults to None so that `temporal workflow start` without --input fails the workflow
        # with a message instead of failing its workflow task forever on a missing argument.
        try:
            return await self._run_command(raw)
        except BaseException as err:
            quiet = isinstance(err, GeneratorExit) or is_cancelled_exception(err) or is_bad_deploy(err)
            if not quiet and self._notify and workflow.patched(PATCH_NOTIFY_FAILURE):
                await self._notify_failed(err)
            raise

    async def _notify_failed(self, err: BaseException) -> None:
        """Tell the operator's webhook the command failed (a child that runs on its own)."""
        status = self._status
        why = status.message or describe(err)
        await notify(
            Notification(
                event="CommandFailed",
                workflow_id=workflow.info().workflow_id,
                text=f"disruption {workflow.info().workflow_id} failed ({status.phase}): {why}",
                nodes=[c.node for c in status.candidates],
                details={"phase": status.phase, "reason": status.reason},
            )
        )

    async def _run_command(self, raw: Any) -> DisruptionStatus:
        command = self._validate(raw)
        self._notify = command.notify
        # Before any command: a run that began on the older code finds no marker and keeps its path.
        self._lean = workflow.patched(PATCH_LEAN_HISTORY)
        self._begin(command)
        if not command.voluntary:
            await self._ending(self._run_forceful(command))
            return self._finish()
        gated = command.approval is not None and (self._lean or workflow.patched(PATCH_APPROVAL_GATE))
        if gated:
            approved = await self._ending(self._approved(command))
            if approved is None:
                return self._status  # rejected, no decision in time, or no longer valid: nothing changed
            command = approved
        try:
            await self._taint_candidates(command)  # 1
            await self._provide_replacements(command)  # 2, 3
        except GeneratorExit:  # evicted from the worker's cache: not a failure, nothing to undo
            raise
        except BaseException as err:
            await self._roll_back(err)  # 4 (re-raises)
            raise
        await self._ending(self._terminate_candidates(command))  # 5
        return self._finish()

    async def _ending(self, step: Awaitable[T]) -> T:
        """Run a step of the command so that however it ends, the run's close and its status agree.

        A bug in workflow code (WORKFLOW_BUGS) fails the run. Before the candidates are handed to their
        terminations, the compensation runs first, so a failed command leaves nothing behind; after,
        the terminations go on and the run says it failed. (The older code failed its workflow task
        for ever there: no history holds commands after such a bug, so this needs no patch.)

        A cancel that no step turned into a phase (one while awaiting approval, or while a spot
        interruption's replacement launched beside its terminations) closes the run in phase Canceled,
        not in the phase it was cancelled in (behind PATCH_CANCELED_PHASE: the older code closed
        without the upsert)."""
        try:
            return await step
        except WORKFLOW_BUGS as err:
            if not (self._handed_over or self._rolling_back):
                await self._roll_back(err)  # raises DisruptionFailed, quoting the bug
            self._status.message = f"failed in workflow code: {describe(err)}"
            self._status.phase = "Failed"  # not _set_phase: the bug may be in what it calls
            self._upsert(sa.PHASE.value_set("Failed"))
            self._publish()
            raise
        except BaseException as err:
            if (
                is_cancelled_exception(err)
                and self._status.phase not in CLOSING_PHASES
                and workflow.patched(PATCH_CANCELED_PHASE)
            ):
                if self._handed_over:
                    self._status.message = HANDED_OVER
                elif self._awaiting_approval:
                    self._status.message = "canceled while awaiting approval; nothing changed"
                self._set_phase("Canceled")
            raise

    async def _run_forceful(self, command: DisruptionInput) -> None:
        try:
            await self._taint_candidates(command)
        except GeneratorExit:  # evicted from the worker's cache: not a failure, nothing to undo
            raise
        except BaseException as err:
            await self._roll_back(err)
            raise
        replacing = asyncio.create_task(self._replacements_best_effort(command))
        if command.termination_deadline is None:
            try:
                await replacing
            except GeneratorExit:  # evicted from the worker's cache: not a failure, nothing to undo
                raise
            except BaseException as err:  # cancelled before anything was handed over: undo it all
                await self._roll_back(err)
                raise
            await self._terminate_candidates(command)
            return
        try:
            await asyncio.gather(self._terminate_candidates(command), replacing)
        except GeneratorExit:  # evicted from the worker's cache: not a failure, nothing to undo
            raise
        except BaseException as err:
            cancelled = is_cancelled_exception(err)
            outlive = not cancelled and self._handed_over and not replacing.done()
            if outlive and workflow.patched(PATCH_REPLACEMENTS_OUTLIVE):
                # A candidate's termination failed after its drain began: its pods need the capacity
                # all the same. The replacements go on (best effort: they discard what fails). Asked
                # before PATCH_DISCARD_ON_TERMINATION_FAILURE, which only runs recorded before it reach.
                try:
                    await workflow.wait([replacing])
                except asyncio.CancelledError:
                    cancelled = True
            interrupted = not replacing.done()
            if interrupted:
                replacing.cancel()
                await asyncio.gather(replacing, return_exceptions=True)
            if cancelled:  # the terminations go on; replacements not yet up go
                await self._discard_unready([])
            elif interrupted and workflow.patched(PATCH_DISCARD_ON_TERMINATION_FAILURE):
                # The terminations failed while a replacement was on its way: its wait is cancelled
                # above, so nothing would ever own its instance (issue 30). Asked only on this path.
                problems: list[str] = []
                discarded = await self._discard_unready(problems)
                self._status.message += f"; terminated {discarded or 0} replacement instance(s)" + (
                    f"; compensation problems: {'; '.join(problems)}" if problems else ""
                )
            raise

    async def _replacements_best_effort(self, command: DisruptionInput) -> None:
        """Provide the replacements of a forceful command; a failure discards the ones that did not
        initialize and is reported, but does not stop the command."""
        if self._lean and command.termination_deadline is not None:
            # The drains must start at once: the children's start commands go out with the workflow
            # task, which the replacements' local activities would hold open until the launch is done.
            await workflow.wait_condition(lambda: self._handed_over)
        try:
            await self._provide_replacements(command)
            await self._recheck_after_drain(command)
        except GeneratorExit:  # evicted from the worker's cache: not a failure, nothing to undo
            raise
        except BaseException as err:
            if is_cancelled_exception(err) or is_bad_deploy(err):
                raise
            problems: list[str] = []
            discarded = await self._discard_unready(problems)
            self._replacement_problem = (
                f"{self._failure_text(err)}; terminated {discarded or 0} replacement instance(s)"
                + (f"; compensation problems: {'; '.join(problems)}" if problems else "")
            )
            workflow.logger.warning(
                "forceful command goes on without its replacements: %s", self._replacement_problem
            )

    # -- 1. taint ---------------------------------------------------------------------------------

    async def _taint_candidates(self, command: DisruptionInput) -> None:
        self._set_phase("Tainting")
        # Regular even on the lean path: its completion is a workflow task, where a cancellation that
        # came during the taint is seen before anything is launched (a local activity's is not).
        results = await self._regular(
            KubernetesActivities.taint_disrupted,
            TaintRequest(
                nodes=command.nodes,
                command_id=self._status.command_id,
                reason=command.reason,
                uids=command.node_uids,
                deadline=command.termination_deadline,
                capacity_buffers=command.capacity_buffers,
            ),
            start_to_close_timeout=API_CALL,
            retry_policy=API_RETRY,
            # A cancellation must not let a taint land after the compensation removed it.
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            summary=f"taint {nodes_summary(command.nodes)}",
        )
        self._stop_if_cancelled()
        by_node = {result.node: result for result in results}
        for candidate in self._status.candidates:
            result = by_node[candidate.node]
            candidate.tainted, candidate.provider_id, candidate.message = (
                result.ok,
                result.provider_id,
                result.message,
            )
            if result.ok:  # pinned from here on (to the input's UID, which the taint checked)
                candidate.uid = result.uid or candidate.uid
                candidate.termination_id = result.termination_id
        pools = sorted(
            {r.nodepool for r in results if r.nodepool} | {s.nodepool for s in command.replacements}
        )
        if pools:
            self._upsert(sa.NODEPOOL.value_set(",".join(pools)))
        refused = [f"{r.node} ({r.message})" for r in results if not r.ok]
        if refused and command.replacements and command.voluntary:
            raise ApplicationError(
                f"could not taint candidate(s) {', '.join(refused)}; "
                "a command with replacements needs every candidate",
                type="CandidateUnavailable",
                non_retryable=True,
            )
        if len(refused) == len(results):
            raise ApplicationError(
                f"no candidate could be tainted: {', '.join(refused)}",
                type="CandidateUnavailable",
                non_retryable=True,
            )

    # -- 2 and 3. replacements: disruption_replacements.py; 4. compensation: disruption_rollback.py ---

    # -- 5. terminate the candidates --------------------------------------------------------------

    async def _terminate_candidates(self, command: DisruptionInput) -> None:
        self._set_phase("Terminating")
        if self._lean:
            self._publish()
            handles, cancelled = await self._start_terminations_at_once(command)
        else:
            handles, cancelled = await self._start_terminations_in_turn(command)
        self._handed_over = True
        if cancelled:
            self._status.message = HANDED_OVER
            self._set_phase("Canceled")
            raise asyncio.CancelledError("workflow cancellation requested")
        try:
            for candidate, handle in handles:
                try:
                    await handle
                    candidate.termination = "Succeeded"
                except ChildWorkflowError as err:
                    if is_cancelled_exception(err) and workflow.cancellation_reason() is not None:
                        raise  # this workflow was cancelled; the child goes on
                    # The termination failed, or was cancelled or terminated from outside (issue 30:
                    # a child's own cancel read as this workflow's, which then said Canceled).
                    candidate.termination = "Failed"
                    candidate.message = describe(err)
        except BaseException as err:
            if is_cancelled_exception(err):
                self._status.message = HANDED_OVER
                self._set_phase("Canceled")
            raise
        failed = [c for c in self._status.candidates if c.termination == "Failed"]
        if failed:
            self._status.message = "termination failed for " + "; ".join(
                f"{c.node}: {c.message}" for c in failed
            )
            self._set_phase("Failed")
            raise ApplicationError(self._status.message, type="TerminationFailed", non_retryable=True)

    async def _start_terminations_in_turn(
        self, command: DisruptionInput
    ) -> tuple[list[tuple[CandidateStatus, workflow.ChildWorkflowHandle[Any, Any]]], bool]:
        """Start the candidates' terminations one after the other (a workflow task each: the runs
        before PATCH_LEAN_HISTORY); say whether a cancellation interrupted them."""
        handles = []
        # Past the point of no return: a cancellation that lands while the children start must not
        # leave the rest of the candidates tainted with no termination, so every child is started.
        cancelled = False
        for candidate in self._status.candidates:
            if not candidate.tainted:
                continue
            handle, interrupted = await self._hand_over(candidate, command)
            cancelled |= interrupted
            if handle is not None:
                handles.append((candidate, handle))
        return handles, cancelled

    async def _start_terminations_at_once(
        self, command: DisruptionInput
    ) -> tuple[list[tuple[CandidateStatus, workflow.ChildWorkflowHandle[Any, Any]]], bool]:
        """Start every candidate's termination in the same workflow task. A cancellation of this
        workflow reaches only the task that waits here (workflow.wait leaves the starts running), so
        every start completes; waiting again after it collects them all."""
        tainted = [c for c in self._status.candidates if c.tainted]
        starts = [asyncio.create_task(self._hand_over(c, command)) for c in tainted]
        cancelled = False
        while starts:
            try:
                await workflow.wait(starts)
                break
            except asyncio.CancelledError:
                cancelled = True
        handles = []
        for candidate, start in zip(tainted, starts, strict=True):
            handle, interrupted = start.result()
            cancelled |= interrupted
            if handle is not None:
                handles.append((candidate, handle))
        return handles, cancelled

    async def _hand_over(
        self, candidate: CandidateStatus, command: DisruptionInput
    ) -> tuple[workflow.ChildWorkflowHandle[Any, Any] | None, bool]:
        """Start one candidate's termination, through a cancellation; no handle when one was
        already running for the node."""
        try:
            handle, interrupted = await through_cancellation(
                lambda: self._start_termination(candidate, command)
            )
        except WorkflowAlreadyStartedError:
            candidate.termination = "AlreadyRunning"
            candidate.message = "a termination of this node was already running"
            return None, False
        candidate.termination = "Running"
        return handle, interrupted

    async def _start_termination(
        self, candidate: CandidateStatus, command: DisruptionInput
    ) -> workflow.ChildWorkflowHandle[Any, Any]:
        # The id of the node's incarnation, as the deletion watcher and interruption derive it, so the
        # node gets one termination whoever starts it. A command that tainted before this change (its
        # history has no termination id) keeps the id it would have used then.
        pinned = (
            self._lean or workflow.patched(PATCH_TERMINATION_PER_INCARNATION)
        ) and candidate.termination_id
        return await workflow.start_child_workflow(
            TerminationWorkflow.run,
            TerminationInput(
                node=candidate.node,
                uid=candidate.uid,
                reason=command.reason,
                provider_id=candidate.provider_id,
                command_id=self._status.command_id,
                deadline=command.termination_deadline,
                timeouts=command.termination,
                notify=command.notify,
            ),
            id=candidate.termination_id if pinned else legacy_termination_workflow_id(candidate.node),
            parent_close_policy=workflow.ParentClosePolicy.ABANDON,
            cancellation_type=workflow.ChildWorkflowCancellationType.ABANDON,
        )

    # -- bookkeeping ------------------------------------------------------------------------------

    def _validate(self, raw: Any) -> DisruptionInput:
        try:
            return parse_input(DisruptionInput, raw)
        except InvalidInput as err:
            self._status.phase = "Failed"
            self._status.message = str(err)
            raise ApplicationError(str(err), type="InvalidInput", non_retryable=True) from None

    def _begin(self, command: DisruptionInput) -> None:
        info = workflow.info()
        # The workflow id plus its first run: a later run that reuses the id (once this one closed)
        # is another command, and must neither adopt nor roll back this one's instances. A reset
        # keeps the first run id, so a reset run still finds what this one launched.
        self._status.command_id = f"{info.workflow_id}@{info.first_execution_run_id}"
        self._status.reason = command.reason
        self._status.forceful = not command.voluntary
        self._status.candidates = [
            CandidateStatus(node=node, uid=command.node_uids.get(node)) for node in command.nodes
        ]
        self._status.replacements = [
            ReplacementStatus(index=index, nodepool=spec.nodepool)
            for index, spec in enumerate(command.replacements)
        ]
        self._upsert(
            sa.NODES.value_set(sa.nodes_value(list(command.nodes))), sa.REASON.value_set(command.reason)
        )
        workflow.logger.info(
            "%s: %s -> %d replacement(s)", command.reason, ", ".join(command.nodes), len(command.replacements)
        )

    def _set_phase(self, phase: DisruptionPhase) -> None:
        # The phase that ends now, timed (metrics only: nothing in the history).
        now = workflow.now()
        if self._phase_started is not None and self._status.phase:
            record_phase(self._status.phase, now - self._phase_started)
        self._phase_started = now
        self._status.phase = phase
        self._upsert(sa.PHASE.value_set(phase))
        if phase in CLOSING_PHASES:
            self._publish()

    def _upsert(self, *updates: SearchAttributeUpdate[Any]) -> None:
        """Upsert search attributes: at once before PATCH_LEAN_HISTORY, else when the workflow next
        waits (`_publish`), folded into one upsert (one history event)."""
        if not self._lean:
            workflow.upsert_search_attributes(list(updates))
            return
        for update in updates:
            self._unpublished[update.key.name] = update

    def _publish(self) -> None:
        if self._unpublished:
            workflow.upsert_search_attributes(list(self._unpublished.values()))
            self._unpublished.clear()

    async def _call(self, activity: Callable[..., Awaitable[T]], arg: Any, **options: Any) -> T:
        """A short Kubernetes or EC2 call (seconds, no heartbeat). On the lean path a local activity:
        a marker inside the current workflow task instead of three events and a workflow task."""
        if not self._lean:
            return await workflow.execute_activity_method(activity, arg, **options)
        if (
            options.pop("cancellation_type", None)
            == workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED
        ):
            # A local activity's cancellation interrupts the call itself (a regular one that does
            # not heartbeat never hears of it): a launch or create in flight would go on in EC2 or the
            # API unrecorded. Shielded, it completes; the caller's `_stop_if_cancelled` then stops.
            call = asyncio.create_task(self._local(activity, arg, options))
            while True:
                try:
                    return await asyncio.shield(call)
                except asyncio.CancelledError:
                    if call.cancelled():
                        raise
        return await self._local(activity, arg, options)

    @staticmethod
    async def _local(activity: Callable[..., Awaitable[T]], arg: Any, options: dict[str, Any]) -> T:
        try:
            return await workflow.execute_local_activity_method(activity, arg, **options)
        except ApplicationError as err:
            # What a local activity raised comes back bare (temporalio 1.35), a regular activity's in
            # an ActivityError: wrap it alike, so that the callers and failures.py read one shape.
            # (The activities' method names are their activity names.)
            wrapper = ActivityError(
                "Activity task failed",
                scheduled_event_id=0,
                started_event_id=0,
                identity="",
                activity_type=getattr(activity, "__name__", ""),
                activity_id="",
                retry_state=None,
            )
            raise wrapper from err

    async def _regular(self, activity: Callable[..., Awaitable[T]], arg: Any, **options: Any) -> T:
        """A regular activity (the waits, which heartbeat; the taint): the search attributes held
        back are upserted first, so that the phase is listable while it runs."""
        self._publish()
        return await workflow.execute_activity_method(activity, arg, **options)

    def _pinned(self) -> list[NodeRef]:
        """The candidates as the activities name them in Events: name, and UID once pinned."""
        return [NodeRef(node=c.node, uid=c.uid) for c in self._status.candidates]

    def _failure_text(self, err: BaseException) -> str:
        if isinstance(err, ReplacementFailed):
            return str(err)
        cause = activity_cause(err)
        if isinstance(cause, ApplicationError) and cause.cause is None:
            return cause.message
        return describe(err)

    def _finish(self) -> DisruptionStatus:
        # Only what initialized replaced anything: a discarded replacement's node is gone.
        replaced = [r.node for r in self._status.replacements if r.node and r.state == "Initialized"]
        terminated = [c for c in self._status.candidates if c.termination != "NotStarted"]
        self._status.message = f"disrupted {len(terminated)} node(s)" + (
            f", replaced by {', '.join(replaced)}" if replaced else ""
        )
        relaunched = [
            f"replacement {index}: {'; '.join(failed)}"
            for index, failed in sorted(self._failed_launches.items())
            if self._status.replacements[index].state == "Initialized"
        ]
        if relaunched:
            self._status.message += f"; launched again after failed launches ({'; '.join(relaunched)})"
        if self._replacement_problem:
            self._status.message += f"; without replacements: {self._replacement_problem}"
        self._set_phase("Succeeded")
        return self.status()


if TYPE_CHECKING:
    # Refused by the type checker when a method the parts declare in DisruptionState is missing.
    _complete: DisruptionState = DisruptionWorkflow()
