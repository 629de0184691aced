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
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from functools import partial
from typing import Any, ClassVar, TypeVar

from temporalio import workflow
from temporalio.common import SearchAttributeUpdate
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    ChildWorkflowError,
    WorkflowAlreadyStartedError,
    is_cancelled_exception,
)
from temporalio.exceptions import (
    TimeoutError as TemporalTimeoutError,
)

with workflow.unsafe.imports_passed_through():
    from activities.ec2 import EC2Activities
    from activities.errors import INSUFFICIENT_CAPACITY, NOT_FOUND, OFFERING_ERRORS
    from activities.kubernetes import KubernetesActivities
    from activities.nodeclaims import NodeClaimActivities
    from activities.waiting_commands import WaitingCommandActivities
    from api import search_attributes as sa
    from api.activity_io import (
        DiscardRequest,
        InitializationRequest,
        InstanceRequest,
        LaunchedInstance,
        LaunchRequest,
        LaunchTemplate,
        NodeClaimCondition,
        NodeClaimDeletion,
        NodeClaimRequest,
        NodeClaimWait,
        NodeRef,
        RegistrationRequest,
        ResolveRequest,
        TaintRequest,
        UntaintRequest,
        WaitingCommandCheck,
        WaitingCommandVerdict,
    )
    from api.constants import aws_provider_id
    from api.workflow_ids import legacy_termination_workflow_id, replacement_nodeclaim_name
    from api.workflow_io import (
        ApprovalDecision,
        CandidateStatus,
        DisruptionInput,
        DisruptionPhase,
        DisruptionStatus,
        InvalidInput,
        Offering,
        ReplacementSpec,
        ReplacementStatus,
        TerminationInput,
        UnavailableOffering,
        parse_input,
    )
    from api.workflow_summaries import awaiting_approval_details, short_node
    from workflows.events import awaiting_approval
    from workflows.failures import WORKFLOW_BUGS, activity_cause, describe, is_bad_deploy
    from workflows.options import (
        API_CALL,
        API_RETRY,
        CHECK_RETRY,
        INSTANCE_TERMINATE,
        INSTANCE_TERMINATE_HEARTBEAT,
        LOOK_AGAIN_CALL,
        LOOK_AGAIN_RETRY,
        WAIT_RETRY,
    )
    from workflows.termination import TerminationWorkflow
    from workflows.workflow_metrics import count_rollback, record_phase


HANDED_OVER = "canceled after the candidates were handed to their terminations, which go on"
# workflow.patched ids (docs/workflow-changes.md): keep each until no workflow started before it runs.
PATCH_TERMINATION_PER_INCARNATION = "termination-id-per-node-incarnation"
PATCH_NODECLAIM_REPLACEMENTS = "karpenter-coexistence-nodeclaims"
PATCH_APPROVAL_GATE = "disruption-approval-gate"
# Short calls as local activities, one upsert per wait, children started at once; implies the three
# patches above, which a run on this path never asks (each would cost a marker and an upsert).
PATCH_LEAN_HISTORY = "disruption-lean-history"
# On the lean path beside Karpenter: one wait for each NodeClaim to be Initialized, not three waits
# (Launched, Registered, Initialized): 47 events to 36. Asked only on that path.
PATCH_NODECLAIM_ONE_WAIT = "disruption-nodeclaim-one-wait"
# With a termination deadline, candidates whose terminations fail while a replacement is still on
# its way: that replacement is discarded as on a cancellation (before: its wait was cancelled and
# its instance left running). Asked only on that path, which a run of the older code ended without.
PATCH_DISCARD_ON_TERMINATION_FAILURE = "forceful-deadline-discard-on-failure"
# Issue 30 (the fault matrix), each asked only on the path it changes:
# a cancel no step turned into a phase closes the run in phase Canceled (an upsert before the close);
PATCH_CANCELED_PHASE = "disruption-canceled-phase"
# a rollback whose listing of the command's instances fails still terminates the ones it knows.
PATCH_DISCARD_KNOWN_INSTANCES = "disruption-discard-known-instances"
# Issue 30: a forceful command whose replacement failed after its launch (the instance ended, its node
# vanished) discards it and launches again with another offering. Asked only at that failure.
PATCH_FORCEFUL_RELAUNCH = "disruption-forceful-relaunch"
# A forceful replacement is launched at most this often (the first launch and its relaunches), and
# launched again only with this much of its deadline left: bounded, however often instances end.
# Issue 30: in a forceful command with a termination deadline (a spot interruption), a candidate's
# termination that fails no longer cancels the replacements launched beside the drain (the drained
# pods still need them). Asked only when a termination failed while a replacement was in flight.
PATCH_REPLACEMENTS_OUTLIVE = "forceful-replacements-outlive-failed-terminations"
# Issue 30: with a termination deadline the candidates drain while their replacements come up; a
# replacement that initialized may go again before the drained pods land on it (a spot reclaim of
# the new node). Once the terminations are done each one is looked at again, and one gone is
# launched again. Asked only on that path, after a replacement initialized.
PATCH_RECHECK_AFTER_DRAIN = "forceful-replacements-rechecked-after-the-drain"
MAX_LAUNCHES = 3
RELAUNCH_MIN_TIME_LEFT = timedelta(seconds=30)
# The phases a command closes in: upserted at once on the lean path (nothing is waited for after).
CLOSING_PHASES = frozenset({"Succeeded", "RolledBack", "Failed", "Canceled", "Rejected", "Invalidated"})
# A command that waits for approval is judged again now and then while it waits, and when the wait
# ends, before any node is taken (activity check_waiting_command, planner/waiting_validation.py).
PATCH_RECHECK_WAITING = "disruption-recheck-waiting-command"  # how often: Approval.recheck_every
# Updates of a command that waits for approval (DisruptionInput.approval).
UPDATE_APPROVE = "approve"
UPDATE_REJECT = "reject"
# How often a step that must finish is run again after a cancellation interrupted it.
CANCELLATION_ATTEMPTS = 3
T = TypeVar("T")


async def through_cancellation(step: Callable[[], Awaitable[T]]) -> tuple[T, bool]:
    """Run a step that must finish (a compensation, or a termination past the point of no return)
    even when a cancellation interrupts it, and say whether one did. A workflow's cancellation is
    delivered once, so running the idempotent step again completes it."""
    interrupted = False
    for _ in range(CANCELLATION_ATTEMPTS):
        try:
            return await step(), interrupted
        except BaseException as err:
            if not is_cancelled_exception(err):
                raise
            interrupted = True
    raise ApplicationError(f"interrupted by cancellation {CANCELLATION_ATTEMPTS} times", non_retryable=True)


class ReplacementFailed(Exception):
    """One replacement could not be provided; the message says which and in what state."""


def _nodes(names: list[str]) -> str:
    """For an activity's one-line summary: `ip-10-0-1-2`, or `3 nodes`."""
    return short_node(names[0]) if len(names) == 1 else f"{len(names)} nodes"


# A bug in this code fails the run (after its compensation, when it came before the handover) rather
# than its workflow task for ever: a command is planned again, and a run that holds its candidates,
# budgets and claims while it retries helps nobody (docs/workflow-changes.md, "When a workflow fails").
@workflow.defn(name="DisruptionWorkflow", failure_exception_types=WORKFLOW_BUGS)
class DisruptionWorkflow:
    # Every activity it calls and every child it starts, in runbook order: the fault matrix's cells
    # (tests/unit/workflows/test_fault_matrix.py checks the lists against this module's code).
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
    CHILDREN: ClassVar[tuple[str, ...]] = ("TerminationWorkflow",)

    def __init__(self) -> None:
        self._status = DisruptionStatus()
        self._unavailable: dict[str, UnavailableOffering] = {}
        # Set when one replacement failed: the others stop at their next step instead of going on
        # to register and initialize a node the rollback is about to discard.
        self._stopping = False
        # Forceful commands only: why their replacements could not be provided (the command goes on).
        self._replacement_problem = ""
        self._phase_started: datetime | None = None  # for the phase durations (workflow_metrics)
        # A command that waits for approval: the decision (approved?, who and why) once made.
        self._awaiting_approval = False
        self._decision: tuple[bool, ApprovalDecision] | None = None
        # PATCH_LEAN_HISTORY taken (decided once, first thing in the run), and the search attribute
        # updates it holds back until the workflow waits: by attribute name, the latest value wins.
        self._lean = False
        self._unpublished: dict[str, SearchAttributeUpdate[Any]] = {}
        self._handed_over = False  # the candidates' terminations have been started
        self._check_problem = ""  # why the last check of a waiting command could not be made
        self._rolling_back = False  # the compensation has begun (a bug in it must not start it again)
        self._claims_created = 0  # replacement NodeClaims created (PATCH_NODECLAIM_ONE_WAIT)
        # Forceful commands: per replacement index, the launches that failed and were discarded before
        # the one in flight ("<offering>: <why>"; PATCH_FORCEFUL_RELAUNCH).
        self._failed_launches: dict[int, list[str]] = {}
        self._templates: dict[int, LaunchTemplate] = {}  # each replacement's, as resolved

    @workflow.query
    def status(self) -> DisruptionStatus:
        return self._status

    @workflow.query
    def phase(self) -> str:
        return self._status.phase

    # -- approval (a NodePool's karpflow.dev/require-approval): validated updates --------------------

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

    def _decision_input(self, name: str, args: tuple[Any, ...]) -> ApprovalDecision:
        if not self._awaiting_approval or self._decision is not None:
            raise ApplicationError(
                f"{name}: this command is not awaiting approval (phase {self._status.phase})"
            )
        if not args or args == (None,):
            return ApprovalDecision()
        if len(args) != 1:
            raise ApplicationError(f"{name}: takes one JSON object, got {len(args)} argument(s)")
        try:
            return parse_input(ApprovalDecision, args[0])
        except InvalidInput as err:
            raise ApplicationError(f"{name}: {err}") from None

    async def _approved(self, command: DisruptionInput) -> DisruptionInput | None:
        """Wait for `approve` or `reject` (no decision within the timeout rejects), then judge the
        command again (PATCH_RECHECK_WAITING): the command to carry out (its nodes may be fewer), or
        None when it was rejected or no longer holds. Nothing is changed before: the plan is readable in
        the status query, the memo and the phase search attribute."""
        assert command.approval is not None
        rechecks = workflow.patched(PATCH_RECHECK_WAITING)
        self._awaiting_approval = True
        self._set_phase("AwaitingApproval")
        workflow.upsert_memo(
            {
                "approval": {
                    "nodes": list(command.nodes),
                    "replacements": [r.model_dump(mode="json") for r in command.replacements],
                    "savings_per_hour": command.approval.savings_per_hour,
                    "timeout": str(command.approval.timeout),
                }
            }
        )
        rejected_at = workflow.now() + command.approval.timeout
        # The UI's "current details" (a query, not a command): the pending plan while it waits.
        workflow.set_current_details(awaiting_approval_details(command, command.approval, rejected_at))
        self._publish()  # the wait may be long: AwaitingApproval must be listable
        # Operators who live in kubectl see the wait on each node (`kubectl describe node`). Inside
        # the patched branch: only runs that reach the gate, all started after it existed, call it.
        await awaiting_approval(
            [NodeRef(node=n, uid=command.node_uids.get(n)) for n in command.nodes],
            workflow.info().workflow_id,
        )
        if rechecks:
            if not await self._await_decision_checking(command, rejected_at):
                return None  # the plan no longer holds: Invalidated
        else:
            try:
                await workflow.wait_condition(
                    lambda: self._decision is not None, timeout=command.approval.timeout
                )
            except TimeoutError:
                self._decide_by_timeout(command.approval.timeout)
        self._awaiting_approval = False
        assert self._decision is not None  # the condition held, or the timeout decided
        approved, decision = self._decision
        who = f" by {decision.by}" if decision.by else ""
        why = f": {decision.reason}" if decision.reason else ""
        self._status.message = f"{'approved' if approved else 'rejected'}{who}{why}"
        if not approved:
            self._status.message += "; nothing changed"
            self._set_phase("Rejected")
        workflow.set_current_details(self._status.message)
        if not approved:
            return None
        if not rechecks:
            return command
        # Approved: the plan may have aged for hours. Judged on a fresh view before the taint.
        verdict = await self._check_waiting(command, final=True)
        if verdict is None or not verdict.valid:
            why = verdict.reason if verdict is not None else self._check_problem
            self._invalidated(f"{self._status.message}, but the plan no longer holds: {why}")
            return None
        return self._narrowed_to(command, verdict.nodes)

    def _decide_by_timeout(self, timeout: timedelta) -> None:
        self._decision = (False, ApprovalDecision(by="timeout", reason=f"no decision within {timeout}"))

    async def _await_decision_checking(self, command: DisruptionInput, rejected_at: datetime) -> bool:
        """Wait for the decision, judging the command again every `recheck_every`: False when it no
        longer holds (the command ends Invalidated). A NodePool that stopped asking for approval ends
        the wait as approved; a check that cannot be made leaves the wait as it is."""
        assert command.approval is not None
        while self._decision is None:
            left = rejected_at - workflow.now()
            if left <= timedelta(0):
                self._decide_by_timeout(command.approval.timeout)
                break
            try:
                await workflow.wait_condition(
                    lambda: self._decision is not None, timeout=min(left, command.approval.recheck_every)
                )
                break
            except TimeoutError:
                pass
            if workflow.now() >= rejected_at:
                continue  # the timeout decides on the next turn
            verdict = await self._check_waiting(command, final=False)
            if self._decision is not None or verdict is None:
                continue  # decided meanwhile, or no view now: keep waiting
            if not verdict.valid:
                self._awaiting_approval = False
                self._invalidated(f"while awaiting approval the plan stopped holding: {verdict.reason}")
                return False
            if not verdict.approval_required:
                self._decision = (
                    True,
                    ApprovalDecision(
                        by="karpflow", reason="no NodePool of the command asks for approval any more"
                    ),
                )
        return True

    async def _check_waiting(self, command: DisruptionInput, final: bool) -> WaitingCommandVerdict | None:
        """The verdict on the waiting command (None when it could not be had: why is in
        `_check_problem`). The final check, before the taint, retries longer."""
        assert command.approval is not None
        try:
            return await self._regular(
                WaitingCommandActivities.check_waiting_command,
                WaitingCommandCheck(
                    workflow_id=workflow.info().workflow_id,
                    reason=command.reason,
                    nodes=list(command.nodes),
                    node_uids=dict(command.node_uids),
                    planned=command.approval.planned,
                ),
                start_to_close_timeout=API_CALL * 4,
                heartbeat_timeout=API_CALL,
                retry_policy=API_RETRY if final else CHECK_RETRY,
                summary=f"is the plan for {_nodes(command.nodes)} still good?",
            )
        except ActivityError as err:
            if is_cancelled_exception(err):
                raise
            self._check_problem = f"it could not be judged again ({describe(err)})"
            workflow.logger.warning("command %s: %s", self._status.command_id, self._check_problem)
            return None

    def _invalidated(self, message: str) -> None:
        self._status.message = f"{message}; nothing changed"
        self._set_phase("Invalidated")
        workflow.set_current_details(self._status.message)

    def _narrowed_to(self, command: DisruptionInput, nodes: list[str]) -> DisruptionInput:
        """The command on the nodes its judgement kept (emptiness keeps the ones still empty)."""
        if not nodes or set(nodes) == set(command.nodes):
            return command
        kept = [n for n in command.nodes if n in nodes]
        self._status.candidates = [c for c in self._status.candidates if c.node in kept]
        self._upsert(sa.NODES.value_set(sa.nodes_value(kept)))
        workflow.logger.info(
            "command %s: judged again, goes on with %s", self._status.command_id, ", ".join(kept)
        )
        return command.model_copy(
            update={"nodes": kept, "node_uids": {n: u for n, u in command.node_uids.items() if n in kept}}
        )

    @workflow.run
    async def run(self, raw: Any = None) -> DisruptionStatus:
        # `raw` defaults to None so that `temporal workflow start` without --input fails the workflow
        # with a message instead of failing its workflow task forever on a missing argument.
        command = self._validate(raw)
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

    async def _recheck_after_drain(self, command: DisruptionInput) -> None:
        """With a termination deadline, once every candidate's termination has closed (its pods are
        displaced by then), look again at each initialized replacement: one whose node is gone or
        going (a spot reclaim of the new node) is launched again, as `_await_ready_or_relaunch` does
        for one that ended before it initialized. A look that fails otherwise changes nothing."""
        # Beside Karpenter a replacement is a NodeClaim, and a node gone is its provisioner's to replace.
        initialized = [
            r for r in self._status.replacements if r.state == "Initialized" and r.node and not r.nodeclaim
        ]
        if not (self._lean and command.termination_deadline is not None and initialized):
            return
        await workflow.wait_condition(
            lambda: (
                self._handed_over
                and all(
                    c.termination not in ("NotStarted", "Running")
                    for c in self._status.candidates
                    if c.tainted
                )
            )
        )
        if not workflow.patched(PATCH_RECHECK_AFTER_DRAIN):
            return
        deadline = workflow.now() + command.timeouts.replacement_ready
        for replacement in initialized:
            spec, template = command.replacements[replacement.index], self._templates[replacement.index]
            instance = self._known_instance(replacement)
            try:
                await self._call(
                    KubernetesActivities.await_node_ready,
                    RegistrationRequest(
                        instance=instance, template=template, registered_node=replacement.node
                    ),
                    start_to_close_timeout=LOOK_AGAIN_CALL,
                    retry_policy=LOOK_AGAIN_RETRY,
                    summary=f"is replacement {short_node(replacement.node or '')} still there?",
                )
                continue
            except ActivityError as err:
                if not self._may_relaunch(command, replacement, err, deadline):
                    workflow.logger.info("replacement %s: not looked at again: %s", replacement.index, err)
                    continue
                replacement.state = "Registered"  # what the relaunch discards: the node, then the instance
                await self._await_ready_or_relaunch(
                    replacement, instance, spec, template, deadline, command, gone=err
                )

    async def _discard_unready(self, problems: list[str]) -> int | None:
        """Terminate the replacement instances that did not initialize (see `_discard_replacements`)."""
        return await self._compensate(
            problems, "discarding replacements", lambda: self._discard_replacements(problems)
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
            ),
            start_to_close_timeout=API_CALL,
            retry_policy=API_RETRY,
            # A cancellation must not let a taint land after the compensation removed it.
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            summary=f"taint {_nodes(command.nodes)}",
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

    # -- 2 and 3. replacements --------------------------------------------------------------------

    async def _provide_replacements(self, command: DisruptionInput) -> None:
        if not command.replacements:
            return
        self._set_phase("Launching")
        tasks = [
            asyncio.create_task(self._provide_replacement(command, index, spec))
            for index, spec in enumerate(command.replacements)
        ]
        try:
            await asyncio.gather(*tasks)
        except GeneratorExit:  # evicted from the worker's cache: not a failure, nothing to undo
            raise
        except BaseException:
            # One replacement failed (or the workflow was cancelled): stop waiting for the others.
            self._stopping = True
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _provide_replacement(self, command: DisruptionInput, index: int, spec: ReplacementSpec) -> None:
        replacement = self._status.replacements[index]
        replacement.state = "Launching"
        deadline = workflow.now() + command.timeouts.replacement_ready
        try:
            # Every step, resolve and launch included, is bounded by the replacement's deadline: a
            # fault that keeps being retried must end in a rollback, not hold the candidates tainted.
            template = await self._call(
                KubernetesActivities.resolve_replacement,
                ResolveRequest(index=index, spec=spec),
                start_to_close_timeout=API_CALL,
                schedule_to_close_timeout=self._time_left(deadline),
                retry_policy=API_RETRY,
                summary=f"replacement {index}: read NodePool {spec.nodepool} and its EC2NodeClass",
            )
            self._templates[index] = template
            if template.via_nodeclaim and (self._lean or workflow.patched(PATCH_NODECLAIM_REPLACEMENTS)):
                await self._provide_by_nodeclaim(replacement, spec, template, deadline, command)
                return
            instance = await self._launch(command, index, spec, template, deadline)
            replacement.state = "Launched"
            if all(r.state not in ("Pending", "Launching") for r in self._status.replacements):
                self._set_phase("WaitingForReplacements")
            if self._lean:
                await self._await_ready_or_relaunch(replacement, instance, spec, template, deadline, command)
                return

            registered = await self._regular(
                KubernetesActivities.await_node_registered,
                RegistrationRequest(instance=instance, template=template, candidates=self._pinned()),
                schedule_to_close_timeout=self._time_left(deadline),
                heartbeat_timeout=command.timeouts.heartbeat,
                retry_policy=WAIT_RETRY,
                summary=f"wait for {instance.instance_id} ({instance.offering.instance_type}) to register",
            )
            replacement.state, replacement.node = "Registered", registered.node

            await self._regular(
                KubernetesActivities.await_node_initialized,
                InitializationRequest(
                    node=registered.node, startup_taints=template.startup_taints, candidates=self._pinned()
                ),
                schedule_to_close_timeout=self._time_left(deadline),
                heartbeat_timeout=command.timeouts.heartbeat,
                retry_policy=WAIT_RETRY,
                summary=f"wait for {short_node(registered.node)} to initialize",
            )
            replacement.state = "Initialized"
        except GeneratorExit:  # evicted from the worker's cache: not a failure, nothing to undo
            raise
        except BaseException as err:
            if is_cancelled_exception(err) or is_bad_deploy(err):
                raise
            self._note_registration(replacement, err)
            replacement.message = self._replacement_failure(
                replacement, err, command.timeouts.replacement_ready
            )
            if earlier := self._failed_launches.get(index):
                replacement.message += (
                    f" (after {len(earlier)} earlier launch(es) failed and were terminated: "
                    f"{'; '.join(earlier)})"
                )
            replacement.state = "Failed"
            raise ReplacementFailed(replacement.message) from err

    async def _await_ready_or_relaunch(
        self,
        replacement: ReplacementStatus,
        instance: LaunchedInstance,
        spec: ReplacementSpec,
        template: LaunchTemplate,
        deadline: datetime,
        command: DisruptionInput,
        gone: BaseException | None = None,
    ) -> None:
        """Wait for the replacement; in a forceful command, one whose instance ended or whose node
        vanished (the wait fails at once, NotFound) is terminated, its offering remembered as
        unavailable, and another launched: the candidates' pods need the capacity, and standalone
        nothing else provides it (beside Karpenter its provisioner does). Bounded by MAX_LAUNCHES and
        the replacement's deadline; a wait that used the deadline up (never registered, never
        initialized) leaves no time for another launch, and fails as before."""
        index = replacement.index
        while True:
            if gone is None:
                try:
                    await self._await_ready(replacement, instance, template, deadline, command)
                    if failed := self._failed_launches.get(index):
                        last = replacement.offering.key if replacement.offering else "?"
                        replacement.message = (
                            f"initialized on launch {len(failed) + 1} ({last}); "
                            f"terminated before: {'; '.join(failed)}"
                        )
                    return
                except GeneratorExit:  # evicted from the worker's cache: not a failure, nothing to undo
                    raise
                except BaseException as err:
                    if not self._may_relaunch(command, replacement, err, deadline):
                        raise
                    # Asked only here: a run of the older code that failed at this point has no marker
                    # and goes on as it did (discarded later, without a relaunch).
                    if not workflow.patched(PATCH_FORCEFUL_RELAUNCH):
                        raise
                    gone = err
            ended, gone = gone, None
            assert ended is not None
            self._note_registration(replacement, ended)
            failure = self._failure_text(ended)
            launched = instance.offering
            self._failed_launches.setdefault(index, []).append(
                f"{launched.key} ({instance.instance_id}) failed while {replacement.state}: {failure}"
            )
            self._mark_unavailable(launched, f"replacement instance failed: {failure}", command)
            workflow.logger.warning(
                "replacement %s: %s failed while %s (%s); terminating it and launching another offering",
                index,
                instance.instance_id,
                replacement.state,
                failure,
            )
            await self._discard(instance)  # before the next launch: nothing of it is left behind
            self._stop_if_cancelled()
            # The next launch is the replacement now; the earlier one is named in _failed_launches.
            replacement.state, replacement.node = "Launching", None
            replacement.instance_id, replacement.offering = None, None
            instance = await self._launch(
                command, index, spec, template, deadline, attempt=len(self._failed_launches[index])
            )
            replacement.state = "Launched"

    def _may_relaunch(
        self, command: DisruptionInput, replacement: ReplacementStatus, err: BaseException, deadline: datetime
    ) -> bool:
        """A forceful replacement that failed for a reason another launch can fix: its instance ended or
        its node disappeared (NotFound), with launches and time left, and no sibling failed."""
        if command.voluntary or self._stopping or replacement.nodeclaim or is_cancelled_exception(err):
            return False
        cause = activity_cause(err)
        if not (isinstance(cause, ApplicationError) and cause.type == NOT_FOUND):
            return False
        if len(self._failed_launches.get(replacement.index, [])) + 1 >= MAX_LAUNCHES:
            return False
        return deadline - workflow.now() >= RELAUNCH_MIN_TIME_LEFT

    async def _await_ready(
        self,
        replacement: ReplacementStatus,
        instance: LaunchedInstance,
        template: LaunchTemplate,
        deadline: datetime,
        command: DisruptionInput,
    ) -> None:
        """Registration and initialization as one wait (the lean path): `_note_registration` reads
        how far it got when it fails."""
        registered = await self._regular(
            KubernetesActivities.await_node_ready,
            RegistrationRequest(instance=instance, template=template, candidates=self._pinned()),
            schedule_to_close_timeout=self._time_left(deadline),
            heartbeat_timeout=command.timeouts.heartbeat,
            retry_policy=WAIT_RETRY,
            summary=f"wait for {instance.instance_id} ({instance.offering.instance_type}) to register "
            "and initialize",
        )
        replacement.state, replacement.node = "Initialized", registered.node

    @staticmethod
    def _note_registration(replacement: ReplacementStatus, err: BaseException) -> None:
        """A failed `await_node_ready` names the node it registered (last heartbeat, or the error's
        details): the replacement was Registered, and its node is the one to release."""
        if replacement.state != "Launched":
            return
        cause = activity_cause(err)
        if isinstance(cause, TemporalTimeoutError):
            details = cause.last_heartbeat_details
        elif isinstance(cause, ApplicationError):
            details = cause.details
        else:
            return
        first = details[0] if details else None
        node = first.get("node") if isinstance(first, dict) else None
        if isinstance(node, str) and node:
            replacement.state, replacement.node = "Registered", node

    async def _provide_by_nodeclaim(
        self,
        replacement: ReplacementStatus,
        spec: ReplacementSpec,
        template: LaunchTemplate,
        deadline: datetime,
        command: DisruptionInput,
    ) -> None:
        """Beside Karpenter: create the replacement's NodeClaim, then follow Karpenter's conditions on it
        (Launched, Registered, Initialized), each wait bounded by the replacement's deadline. A NodeClaim
        Karpenter deletes (no capacity, a registration timeout) fails the replacement at once."""
        name = replacement_nodeclaim_name(spec.nodepool, self._status.command_id, replacement.index)
        replacement.nodeclaim = name  # before it exists: the rollback deletes it by name
        created = await self._call(
            NodeClaimActivities.create_nodeclaim,
            NodeClaimRequest(
                name=name,
                command_id=self._status.command_id,
                index=replacement.index,
                spec=spec,
                template=template,
                candidates=self._pinned(),
                reason=command.reason,
            ),
            start_to_close_timeout=API_CALL,
            schedule_to_close_timeout=self._time_left(deadline),
            retry_policy=API_RETRY,
            # A create in flight must finish before the compensation deletes what it created.
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            summary=f"replacement {replacement.index}: ask Karpenter for NodeClaim {name}",
        )
        self._stop_if_cancelled()
        wait = partial(self._await_nodeclaim, replacement, name, created.uid, deadline, command)
        if self._lean and workflow.patched(PATCH_NODECLAIM_ONE_WAIT):
            # One wait: its heartbeat says how far the NodeClaim got (instance, node), which
            # `temporal workflow describe` and the Web UI show while it runs.
            self._claims_created += 1
            if self._claims_created == len(self._status.replacements):
                self._set_phase("WaitingForReplacements")  # every NodeClaim is Karpenter's to launch now
            await wait("Initialized", "launched, registered and initialized", self._pinned())
            return
        for condition in ("Launched", "Registered", "Initialized"):
            await wait(condition, condition, [])
            if condition == "Launched" and all(
                r.state not in ("Pending", "Launching") for r in self._status.replacements
            ):
                self._set_phase("WaitingForReplacements")

    async def _await_nodeclaim(
        self,
        replacement: ReplacementStatus,
        name: str,
        uid: str | None,
        deadline: datetime,
        command: DisruptionInput,
        until: NodeClaimCondition,
        saying: str,
        candidates: list[NodeRef],
    ) -> None:
        """Wait until Karpenter says `until` on the NodeClaim; the replacement takes what it filled in."""
        claim = await self._regular(
            NodeClaimActivities.await_nodeclaim,
            NodeClaimWait(name=name, uid=uid, until=until, candidates=candidates),
            schedule_to_close_timeout=self._time_left(deadline),
            heartbeat_timeout=command.timeouts.heartbeat,
            retry_policy=WAIT_RETRY,
            summary=f"wait for NodeClaim {name} to be {saying}",
        )
        replacement.offering = claim.offering or replacement.offering
        replacement.instance_id = claim.instance_id or replacement.instance_id
        replacement.node = claim.node or replacement.node
        replacement.state = until

    async def _launch(
        self,
        command: DisruptionInput,
        index: int,
        spec: ReplacementSpec,
        template: LaunchTemplate,
        deadline: datetime,
        attempt: int = 0,
    ) -> LaunchedInstance:
        """Try the offerings in order; capacity errors move on to the next and are remembered.
        `attempt`: how many launches of this replacement failed before (a relaunch's ClientToken)."""
        tried: list[str] = []
        for offering in spec.offering_order(template.zones):
            if self._is_unavailable(offering):
                tried.append(f"{offering.key}: skipped, {self._unavailable[offering.key].error}")
                continue
            try:
                launched = await self._call(
                    EC2Activities.launch_instance,
                    LaunchRequest(
                        command_id=self._status.command_id,
                        index=index,
                        offering=offering,
                        template=template,
                        candidates=self._pinned(),
                        reason=command.reason,
                        attempt=attempt,
                    ),
                    start_to_close_timeout=API_CALL,
                    schedule_to_close_timeout=self._time_left(deadline),
                    retry_policy=API_RETRY,
                    # A launch in flight must finish before compensation looks for instances to terminate.
                    cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                    summary=f"launch {offering.instance_type} {offering.capacity_type} in {offering.zone}",
                )
                # Written down before anything else: the rollback terminates what workflow state
                # knows even where EC2's tag index has not caught up with the launch yet.
                replacement = self._status.replacements[index]
                replacement.instance_id, replacement.offering = launched.instance_id, launched.offering
                self._stop_if_cancelled()
                return launched
            except ActivityError as err:
                cause = err.cause
                if not (isinstance(cause, ApplicationError) and cause.type in OFFERING_ERRORS):
                    raise
                tried.append(f"{offering.key}: {cause.type}")
                if cause.type == INSUFFICIENT_CAPACITY:
                    self._mark_unavailable(offering, cause.message, command)
                workflow.logger.info(
                    "replacement %s: offering %s unavailable (%s); trying the next",
                    index,
                    offering.key,
                    cause.type,
                )
        raise ApplicationError(
            f"no offering could be launched ({'; '.join(tried) or 'no offerings'})",
            type="NoOfferingAvailable",
            non_retryable=True,
        )

    def _stop_if_cancelled(self) -> None:
        """An activity awaited with WAIT_CANCELLATION_COMPLETED that finishes anyway returns its result
        and swallows the cancellation (of the workflow, or of this replacement's task when a sibling
        failed): look for it explicitly."""
        if workflow.cancellation_reason() is not None:
            raise asyncio.CancelledError("workflow cancellation requested")
        if self._stopping:
            raise asyncio.CancelledError("another replacement failed")

    def _is_unavailable(self, offering: Offering) -> bool:
        entry = self._unavailable.get(offering.key)
        return entry is not None and workflow.now() < entry.until

    def _mark_unavailable(self, offering: Offering, error: str, command: DisruptionInput) -> None:
        until = workflow.now() + command.timeouts.unavailable_offering_ttl
        self._unavailable[offering.key] = UnavailableOffering(offering=offering.key, until=until, error=error)
        self._status.unavailable_offerings = list(self._unavailable.values())

    @staticmethod
    def _time_left(deadline: datetime) -> timedelta:
        return max(deadline - workflow.now(), timedelta(seconds=1))

    @staticmethod
    def _replacement_failure(replacement: ReplacementStatus, err: BaseException, timeout: timedelta) -> str:
        where = [f"nodepool {replacement.nodepool}"]
        if replacement.offering:
            where.append(replacement.offering.key)
        if replacement.nodeclaim:
            where.append(f"NodeClaim {replacement.nodeclaim}")
        if replacement.instance_id:
            where.append(f"instance {replacement.instance_id}")
        if replacement.node:
            where.append(f"node {replacement.node}")
        cause = activity_cause(err)
        if isinstance(cause, TemporalTimeoutError):
            details = cause.last_heartbeat_details
            waiting = (
                (details[0] or {}).get("waiting_for") if details and isinstance(details[0], dict) else None
            )
            what = {
                "Launched": "no node registered",
                "Registered": "the node did not initialize",
            }.get(replacement.state, "it was not ready")
            reason = f"{what} within {timeout}" + (f" (still waiting for: {waiting})" if waiting else "")
        else:
            reason = describe(err)
        return (
            f"replacement {replacement.index} ({', '.join(where)}) failed while {replacement.state}: {reason}"
        )

    # -- 4. compensation --------------------------------------------------------------------------

    async def _roll_back(self, err: BaseException) -> None:
        """Undo steps 1-3. Activities started here run even when the workflow was cancelled. Not for
        a bad deploy (the caller re-raises it): its workflow task fails, and is retried."""
        if is_bad_deploy(err):
            return
        self._rolling_back = True
        cancelled = is_cancelled_exception(err)
        failure = "canceled" if cancelled else self._failure_text(err)
        self._set_phase("RollingBack")
        if self._status.reason:
            count_rollback(self._status.reason)
        problems: list[str] = []
        untainted = await self._compensate(
            problems, "untainting candidates", lambda: self._untaint_candidates(failure)
        )
        discarded = await self._discard_unready(problems)
        kept = [r for r in self._status.replacements if r.state == "Initialized"]
        discarded_what = (
            "deleted {} replacement NodeClaim(s) (Karpenter terminates their instances)"
            if any(r.nodeclaim for r in self._status.replacements)
            else "terminated {} replacement instance(s)"
        )
        summary = f"rolled back: untainted {untainted or 0} candidate(s), " + discarded_what.format(
            discarded or 0
        )
        if kept:
            names = ", ".join(r.node or "" for r in kept)
            summary += f"; kept {len(kept)} initialized replacement(s) as ordinary nodes ({names})"
        if problems:
            summary += f"; compensation problems: {'; '.join(problems)}"
        self._status.message = f"{failure}; {summary}"
        if cancelled:
            self._set_phase("Canceled")
            return  # the caller re-raises the cancellation: the workflow closes as CANCELED
        self._set_phase("RolledBack")
        raise ApplicationError(self._status.message, type="DisruptionFailed", non_retryable=True) from None

    @staticmethod
    async def _compensate(problems: list[str], what: str, step: Callable[[], Awaitable[int]]) -> int | None:
        """Run one compensation step to the end, and report rather than raise what cannot be undone."""
        try:
            done, _ = await through_cancellation(step)
            return done
        except Exception as err:
            if is_bad_deploy(err):
                raise
            problems.append(f"{what}: {describe(err)}")
            return None

    async def _untaint_candidates(self, why: str) -> int:
        # Every candidate, not only those known tainted: a cancelled taint call may have tainted some
        # without telling. Untainting is a no-op on a node without the taint, and skips deleting nodes.
        # Each node released gets a DisruptionRolledBack Event saying why (recorded by the activity).
        untainted = await self._call(
            KubernetesActivities.untaint_disrupted,
            UntaintRequest(
                nodes=[c.node for c in self._status.candidates],
                command_id=self._status.command_id,
                uids={c.node: c.uid for c in self._status.candidates if c.uid},
                rolled_back=why,
            ),
            start_to_close_timeout=API_CALL,
            retry_policy=API_RETRY,
            summary=f"roll back: untaint {_nodes([c.node for c in self._status.candidates])}",
        )
        # Count only what this command had tainted: the activity also names nodes it found untainted.
        released = [c for c in self._status.candidates if c.tainted and c.node in untainted]
        for candidate in self._status.candidates:
            candidate.tainted = candidate.tainted and candidate.node not in untainted
        return len(released)

    async def _discard_replacements(self, problems: list[str]) -> int:
        if not self._status.replacements:
            return 0
        if any(r.nodeclaim for r in self._status.replacements):
            # Beside Karpenter the command launched no instance: its replacements are NodeClaims.
            return await self._delete_nodeclaims()
        # Ask EC2 as well as workflow state: a launch may have completed after the workflow stopped
        # waiting for it, and EC2's tag filter may not list an instance launched a moment ago.
        try:
            instances = await self._call(
                EC2Activities.find_command_instances,
                self._status.command_id,
                start_to_close_timeout=API_CALL,
                retry_policy=API_RETRY,
                summary="roll back: find the instances this command launched",
            )
        except ActivityError as err:
            if is_cancelled_exception(err) or not workflow.patched(PATCH_DISCARD_KNOWN_INSTANCES):
                raise
            # EC2 cannot list them now: terminate what workflow state knows (before, nothing was, and
            # a launched replacement was left running), and say the listing failed.
            problems.append(f"listing this command's instances: {describe(err)}")
            instances = []
        listed = {instance.instance_id for instance in instances}
        instances += [
            self._known_instance(r)
            for r in self._status.replacements
            if r.instance_id and r.offering and r.instance_id not in listed
        ]
        keep = {r.instance_id for r in self._status.replacements if r.state in ("Initialized", "Discarded")}
        doomed = [instance for instance in instances if instance.instance_id not in keep]
        outcomes = await asyncio.gather(*(self._discard(i) for i in doomed), return_exceptions=True)
        for instance, outcome in zip(doomed, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if is_cancelled_exception(outcome) or is_bad_deploy(outcome):
                    raise outcome  # _compensate runs the step again; discarding is idempotent
                problems.append(f"instance {instance.instance_id}: {describe(outcome)}")
        return sum(1 for outcome in outcomes if not isinstance(outcome, BaseException))

    async def _delete_nodeclaims(self) -> int:
        """Delete the NodeClaims of the replacements that did not initialize (Karpenter terminates
        their instances and deletes their Nodes); initialized ones stay, as ordinary nodes."""
        doomed = [
            r
            for r in self._status.replacements
            if r.nodeclaim and r.state not in ("Initialized", "Discarded")
        ]
        if not doomed:
            return 0
        deleted = await self._call(
            NodeClaimActivities.delete_nodeclaims,
            NodeClaimDeletion(names=[r.nodeclaim or "" for r in doomed], command_id=self._status.command_id),
            start_to_close_timeout=API_CALL,
            retry_policy=API_RETRY,
            summary=f"roll back: delete {len(doomed)} NodeClaim(s)",
        )
        for replacement in doomed:
            if replacement.nodeclaim in deleted:
                replacement.state = "Discarded"
        return len(deleted)

    @staticmethod
    def _known_instance(replacement: ReplacementStatus) -> LaunchedInstance:
        assert replacement.instance_id and replacement.offering
        return LaunchedInstance(
            instance_id=replacement.instance_id,
            index=replacement.index,
            provider_id=aws_provider_id(replacement.offering.zone, replacement.instance_id),
            private_dns_name=replacement.node or "",
            offering=replacement.offering,
        )

    async def _discard(self, instance: LaunchedInstance) -> None:
        replacement = next(
            (r for r in self._status.replacements if r.instance_id == instance.instance_id), None
        )
        if (
            replacement is None
            and instance.index is not None
            and instance.index < len(self._status.replacements)
        ):
            replacement = self._status.replacements[instance.index]
        node = (replacement.node if replacement else None) or instance.private_dns_name or None
        # The instance first: a kubelet still running would register its Node again after a delete.
        await self._regular(
            EC2Activities.terminate_instance,
            InstanceRequest(instance_id=instance.instance_id, node=node),
            start_to_close_timeout=INSTANCE_TERMINATE,
            heartbeat_timeout=INSTANCE_TERMINATE_HEARTBEAT,
            retry_policy=API_RETRY,
            summary=f"roll back: terminate replacement {instance.instance_id}",
        )
        await self._call(
            KubernetesActivities.release_node,
            DiscardRequest(instance_id=instance.instance_id, node=node),
            start_to_close_timeout=API_CALL,
            retry_policy=API_RETRY,
            summary=f"roll back: release the node of {instance.instance_id}",
        )
        if replacement is not None:
            replacement.state, replacement.instance_id = "Discarded", instance.instance_id

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
