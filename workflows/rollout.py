"""RolloutWorkflow: replace every node of a NodePool created before the request (`karpflow rollout`).

`rollout/<cluster>/<pool>/<hash>`. It decides nothing about disruption itself: it marks the nodes
(`karpflow.dev/rollout-requested`), and the controller's planner treats a marked node as drifted,
so each replacement is a DisruptionWorkflow the controller starts within budgets, rate budgets,
MaintenanceWindows (Drift), NodeDisruptionBudgets, pauses and approval. The rollout only watches:

1. `mark_rollout_nodes`: the pool's nodes (matching the selector) created before `requested_at`,
   marked and pinned by UID;
2. every `poll_interval` (a durable timer) `rollout_remaining` reads which UIDs still exist; the
   status query and the memo show total, replaced and remaining; it completes when none remains;
3. after `polls_per_run` polls (or when Temporal suggests it) it continues as new with the remaining
   nodes, so its history stays bounded however long the rollout takes;
4. cancelled, it takes its marks off (`unmark_rollout_nodes`) and ends Canceled: commands already
   started finish, nothing new is planned for its nodes.

A failed activity never ends it: the failure is shown in the status and the next poll tries again;
only a refused start (no such NodePool, bad input) fails it, before anything is marked.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from activities.errors import REFUSED
    from activities.rollout import RolloutActivities
    from api import search_attributes as sa
    from api.notifications import Notification
    from api.rollout_io import (
        AbortRequest,
        MarkRequest,
        RemainingRequest,
        RolloutInput,
        RolloutNode,
        RolloutPhase,
        RolloutStatus,
        UnmarkRequest,
    )
    from api.workflow_io import InvalidInput, parse_input
    from workflows.failures import WORKFLOW_BUGS, describe
    from workflows.options import API_CALL, API_RETRY

from workflows.notify import notify
from workflows.rollout_waves import Waves

# workflow.patched ids (docs/workflow-changes.md). Issue 35: the operator's webhook is told when a
# rollout finished (asked only then).
PATCH_NOTIFY_FINISHED = "rollout-notify-finished"


# A bug in this code fails the run after taking its marks off (a failed rollout must not go on
# replacing nodes that nothing follows); a NondeterminismError only fails the workflow task
# (docs/workflow-changes.md, "When a workflow fails").
@workflow.defn(name="RolloutWorkflow", failure_exception_types=WORKFLOW_BUGS)
class RolloutWorkflow:
    # Every activity it calls and every child it starts, in runbook order: the fault matrix's cells
    # (tests/unit/workflows/test_fault_matrix.py checks the lists against this module's code).
    ACTIVITIES: ClassVar[tuple[str, ...]] = (
        "mark_rollout_nodes",
        "rollout_remaining",
        "unmark_rollout_nodes",
        # With a rollout policy (workflows/rollout_waves.py):
        "mark_rollout_wave",
        "check_wave_health",
        "sync_rollout_state",
    )
    CHILDREN: ClassVar[tuple[str, ...]] = ("NotificationWorkflow",)

    def __init__(self) -> None:
        self._status = RolloutStatus()
        self.abort_request: AbortRequest | None = None
        self.resume_requested = False

    @workflow.query(name="status")
    def status(self) -> RolloutStatus:
        return self._status

    @property
    def status_(self) -> RolloutStatus:
        return self._status

    @workflow.signal(name="resume")
    def resume(self) -> None:
        """A halted rollout goes on with its next wave (ignored unless halted)."""
        if self._status.phase == "Halted":
            self.resume_requested = True

    @workflow.signal(name="abort")
    def abort(self, request: AbortRequest | None = None) -> None:
        """Stop the waves: marks off; `rollback` marks the nodes the rollout launched (waves only; a
        rollout without a policy is stopped with a cancel)."""
        if self.abort_request is None:
            self.abort_request = request or AbortRequest()

    @workflow.run
    async def run(self, raw: Any = None) -> RolloutStatus:
        request = self._validate(raw)
        rollout_id = workflow.info().workflow_id
        self._status = RolloutStatus(
            rollout_id=rollout_id,
            nodepool=request.nodepool,
            selector=request.selector,
            requested_at=request.requested_at,
            total=request.total,
        )
        workflow.upsert_search_attributes(
            [sa.NODEPOOL.value_set(request.nodepool), sa.REASON.value_set("Rollout")]
        )
        try:
            nodes = request.nodes
            if nodes is None:
                self._set_phase("Marking")
                nodes = await self._mark(request, rollout_id)
                request = request.model_copy(update={"nodes": nodes, "total": len(nodes)})
                self._status.total = len(nodes)
            if request.policy is not None:
                self._set_phase("Rolling")
                return await Waves(self, request).run()
            self._set_phase("Rolling")
            for _ in range(request.polls_per_run):
                nodes = await self.remaining(request, rollout_id, nodes)
                self.show(nodes)
                if not nodes:
                    self._set_phase("Succeeded")
                    self._status.message = f"all {self._status.total} node(s) replaced"
                    if request.notify and workflow.patched(PATCH_NOTIFY_FINISHED):
                        await notify(
                            Notification(
                                event="RolloutFinished",
                                workflow_id=workflow.info().workflow_id,
                                text=f"rollout of {request.nodepool} finished: {self._status.message}",
                                nodepool=request.nodepool,
                            )
                        )
                    return self._status
                if workflow.info().is_continue_as_new_suggested():
                    break
                await workflow.sleep(request.poll_interval)
            workflow.continue_as_new(request.model_copy(update={"nodes": nodes}))
        except BaseException as err:
            if isinstance(err, WORKFLOW_BUGS):
                # The older code failed its workflow task for ever here: no history holds commands
                # after such a bug, so taking the marks off needs no patch.
                await self._unmark_after_bug(request, rollout_id, describe(err))
                raise
            if not is_cancelled_exception(err):
                raise
            await self._unmark(request, rollout_id)
            raise

    def _validate(self, raw: Any) -> RolloutInput:
        try:
            return parse_input(RolloutInput, raw)
        except InvalidInput as err:
            raise ApplicationError(str(err), type="InvalidInput", non_retryable=True) from None

    async def _mark(self, request: RolloutInput, rollout_id: str) -> list[RolloutNode]:
        mark = MarkRequest(
            rollout_id=rollout_id,
            nodepool=request.nodepool,
            selector=request.selector,
            requested_at=request.requested_at,
            # Waves mark their nodes one wave at a time (workflows/rollout_waves.py).
            mark=request.policy is None,
        )
        while True:
            try:
                marked = await workflow.execute_activity_method(
                    RolloutActivities.mark_rollout_nodes,
                    mark,
                    start_to_close_timeout=API_CALL,
                    heartbeat_timeout=API_CALL,
                    retry_policy=API_RETRY,
                    # A cancel waits for the marking to end, so the unmarking after it sees every mark.
                    cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                    summary=f"mark the nodes of {request.nodepool} created before the request",
                )
                # A marking that finished despite a cancel returns its result and swallows the
                # cancellation: look for it, so the marks it made come off.
                if workflow.cancellation_reason() is not None:
                    raise asyncio.CancelledError("workflow cancellation requested")
                return marked
            except ActivityError as err:
                if is_cancelled_exception(err):
                    raise  # the workflow's cancel, through the activity: never a failure to retry
                cause = err.cause
                if isinstance(cause, ApplicationError) and cause.type == REFUSED:
                    raise ApplicationError(cause.message, type=REFUSED, non_retryable=True) from None
                # Marking is idempotent: after a pause, the same nodes are found and marked again.
                self._status.message = (
                    f"marking failed, tried again in {request.poll_interval}: {describe(err)}"
                )
                await workflow.sleep(request.poll_interval)

    async def remaining(
        self,
        request: RolloutInput,
        rollout_id: str,
        nodes: list[RolloutNode],
        remark: list[str] | None = None,
    ) -> list[RolloutNode]:
        try:
            remaining = await workflow.execute_activity_method(
                RolloutActivities.rollout_remaining,
                RemainingRequest(
                    rollout_id=rollout_id, nodepool=request.nodepool, nodes=nodes, remark=remark
                ),
                start_to_close_timeout=API_CALL,
                retry_policy=API_RETRY,
                summary=f"which of {len(nodes)} node(s) remain",
            )
        except ActivityError as err:
            if is_cancelled_exception(err):
                raise  # the workflow's cancel, through the activity: never a failure to retry
            # Keep the last answer; the next poll asks again (a long-lived workflow survives it).
            self._status.message = f"could not read the remaining nodes: {describe(err)}"
            return nodes
        self._status.message = ""
        return remaining

    async def _unmark(self, request: RolloutInput, rollout_id: str) -> None:
        self._set_phase("Canceling")
        try:
            changed = await workflow.execute_activity_method(
                RolloutActivities.unmark_rollout_nodes,
                UnmarkRequest(rollout_id=rollout_id, nodepool=request.nodepool, nodes=request.nodes),
                start_to_close_timeout=API_CALL,
                heartbeat_timeout=API_CALL,
                retry_policy=API_RETRY,
                summary="take the rollout's marks off",
            )
            self._status.message = f"cancelled: the marks of {changed} node(s) taken off"
        except ActivityError as err:
            self._status.message = f"cancelled; taking the marks off failed: {describe(err)}"
        self._set_phase("Canceled")

    async def _unmark_after_bug(self, request: RolloutInput, rollout_id: str, bug: str) -> None:
        """A bug failed the run: the marks come off first, and the status and Phase say Failed."""
        try:
            changed = await workflow.execute_activity_method(
                RolloutActivities.unmark_rollout_nodes,
                UnmarkRequest(rollout_id=rollout_id, nodepool=request.nodepool, nodes=request.nodes),
                start_to_close_timeout=API_CALL,
                heartbeat_timeout=API_CALL,
                retry_policy=API_RETRY,
                summary="take the rollout's marks off",
            )
            undone = f"the marks of {changed} node(s) taken off"
        except ActivityError as err:
            undone = f"taking the marks off failed: {describe(err)}"
        self._status.message = f"failed in workflow code ({bug}); {undone}"
        self._status.phase = "Failed"
        workflow.upsert_search_attributes([sa.PHASE.value_set("Failed")])

    async def unmark_nodes(
        self, request: RolloutInput, rollout_id: str, nodes: list[RolloutNode] | None
    ) -> None:
        """Take this rollout's mark off these nodes (None: all it marked); a failure is shown only."""
        try:
            await workflow.execute_activity_method(
                RolloutActivities.unmark_rollout_nodes,
                UnmarkRequest(rollout_id=rollout_id, nodepool=request.nodepool, nodes=nodes),
                start_to_close_timeout=API_CALL,
                heartbeat_timeout=API_CALL,
                retry_policy=API_RETRY,
                summary=f"take the marks off {len(nodes) if nodes is not None else 'every'} node(s)",
            )
        except ActivityError as err:
            if is_cancelled_exception(err):
                raise
            self._status.message = f"taking the marks off failed: {describe(err)}"

    def show(self, nodes: list[RolloutNode]) -> None:
        names = [n.name for n in nodes]
        if names == self._status.remaining and self._status.replaced == self._status.total - len(names):
            return  # nothing changed: no memo upsert, no history event
        self._status.remaining = names
        self._status.replaced = self._status.total - len(names)
        self._memo()

    def set_phase(self, phase: RolloutPhase) -> None:
        self._set_phase(phase)

    def _set_phase(self, phase: RolloutPhase) -> None:
        self._status.phase = phase
        workflow.upsert_search_attributes([sa.PHASE.value_set(phase)])
        self._memo()

    def _memo(self) -> None:
        workflow.upsert_memo(
            {
                "rollout": {
                    "phase": self._status.phase,
                    "total": self._status.total,
                    "replaced": self._status.replaced,
                    "remaining": len(self._status.remaining),
                    # Waves only: a memo without them is what a rollout without a policy always wrote.
                    **(
                        {"wave": self._status.wave, "halted": self._status.halted[:200]}
                        if self._status.policy is not None
                        else {}
                    ),
                }
            }
        )
