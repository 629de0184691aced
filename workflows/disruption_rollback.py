"""The compensation of a command, a part of DisruptionWorkflow (step 4 of its runbook): untaint the
candidates, terminate the replacement instances that never initialized (those EC2 lists for the
command, and those workflow state knows) and release their nodes, or, beside Karpenter, delete their
NodeClaims. Replacements that did initialize stay as ordinary nodes. Each step runs to its end
through a cancellation, and what cannot be undone is reported, not raised."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from activities.ec2 import EC2Activities
    from activities.kubernetes import KubernetesActivities
    from activities.nodeclaims import NodeClaimActivities
    from api.activity_io import (
        DiscardRequest,
        InstanceRequest,
        LaunchedInstance,
        NodeClaimDeletion,
        UntaintRequest,
    )
    from api.constants import aws_provider_id
    from api.workflow_io import ReplacementStatus
    from workflows.disruption_patches import PATCH_DISCARD_KNOWN_INSTANCES
    from workflows.failures import describe, is_bad_deploy
    from workflows.options import API_CALL, API_RETRY, INSTANCE_TERMINATE, INSTANCE_TERMINATE_HEARTBEAT
    from workflows.workflow_metrics import count_rollback

from workflows.disruption_state import DisruptionState, nodes_summary, through_cancellation


class DisruptionRollback(DisruptionState):
    """Undo steps 1-3 of a command: untaint, discard the replacements that did not initialize."""

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
            summary=f"roll back: untaint {nodes_summary([c.node for c in self._status.candidates])}",
        )
        # Count only what this command had tainted: the activity also names nodes it found untainted.
        released = [c for c in self._status.candidates if c.tainted and c.node in untainted]
        for candidate in self._status.candidates:
            candidate.tainted = candidate.tainted and candidate.node not in untainted
        return len(released)

    async def _discard_unready(self, problems: list[str]) -> int | None:
        """Terminate the replacement instances that did not initialize (see `_discard_replacements`)."""
        return await self._compensate(
            problems, "discarding replacements", lambda: self._discard_replacements(problems)
        )

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
