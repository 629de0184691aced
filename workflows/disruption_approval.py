"""The approval of a waiting command (a NodePool's karpflow.dev/require-approval), a part of
DisruptionWorkflow (disruption.py holds its `approve` and `reject` updates, which read the decision
checked here): the wait for the decision, the timeout that rejects, and the judgement of the command
again, while it waits and once approved, against today's cluster (check_waiting_command,
planner/waiting_validation.py) before anything is changed."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from activities.waiting_commands import WaitingCommandActivities
    from api import search_attributes as sa
    from api.activity_io import NodeRef, WaitingCommandCheck, WaitingCommandVerdict
    from api.notifications import Notification
    from api.workflow_io import ApprovalDecision, DisruptionInput, InvalidInput, parse_input
    from api.workflow_summaries import awaiting_approval_details
    from workflows.disruption_patches import PATCH_NOTIFY_APPROVAL, PATCH_RECHECK_WAITING
    from workflows.events import awaiting_approval
    from workflows.failures import describe
    from workflows.options import API_CALL, API_RETRY, CHECK_RETRY

from workflows.disruption_state import DisruptionState, nodes_summary
from workflows.notify import notify


class DisruptionApproval(DisruptionState):
    """Wait for `approve` or `reject`, and judge the waiting command again."""

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

    async def _notify_awaiting(self, command: DisruptionInput, rejected_at: datetime) -> None:
        """Tell the operator's webhook a command waits for them (a child that runs on its own)."""
        assert command.approval is not None
        workflow_id = workflow.info().workflow_id
        savings = command.approval.savings_per_hour
        saves = f", saving ${savings:.2f}/h" if savings else ""
        await notify(
            Notification(
                event="ApprovalPending",
                workflow_id=workflow_id,
                text=(
                    f"{command.reason} command awaits approval: {', '.join(command.nodes)}{saves}. "
                    f"`karpflow approve {workflow_id}` or `karpflow reject {workflow_id}` before "
                    f"{rejected_at:%Y-%m-%d %H:%M} UTC (then it is rejected)"
                ),
                nodes=list(command.nodes),
                details={"reason": command.reason, "rejected_at": rejected_at.isoformat()},
            )
        )

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
        if command.notify and workflow.patched(PATCH_NOTIFY_APPROVAL):
            await self._notify_awaiting(command, rejected_at)
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
                summary=f"is the plan for {nodes_summary(command.nodes)} still good?",
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
