"""Providing a command's replacements, a part of DisruptionWorkflow (steps 2 and 3 of its runbook):
resolve each replacement's launch template, launch it (offerings in price order; one out of capacity
is remembered as unavailable, in workflow state, and the next is tried) or, beside Karpenter, create
its NodeClaim, then wait until its node registers and initializes. In a forceful command, a
replacement whose instance ended or whose node vanished is discarded and launched again with another
offering (PATCH_FORCEFUL_RELAUNCH), and, with a termination deadline, looked at again once the
candidates' terminations are done (PATCH_RECHECK_AFTER_DRAIN)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from functools import partial

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

with workflow.unsafe.imports_passed_through():
    from activities.ec2 import EC2Activities
    from activities.errors import INSUFFICIENT_CAPACITY, NOT_FOUND, OFFERING_ERRORS
    from activities.kubernetes import KubernetesActivities
    from activities.nodeclaims import NodeClaimActivities
    from api.activity_io import (
        InitializationRequest,
        LaunchedInstance,
        LaunchRequest,
        LaunchTemplate,
        NodeClaimCondition,
        NodeClaimRequest,
        NodeClaimWait,
        NodeRef,
        RegistrationRequest,
        ResolveRequest,
    )
    from api.workflow_ids import replacement_nodeclaim_name
    from api.workflow_io import (
        DisruptionInput,
        Offering,
        ReplacementSpec,
        ReplacementStatus,
        UnavailableOffering,
    )
    from api.workflow_summaries import short_node
    from workflows.disruption_patches import (
        PATCH_FORCEFUL_RELAUNCH,
        PATCH_NODECLAIM_ONE_WAIT,
        PATCH_NODECLAIM_REPLACEMENTS,
        PATCH_RECHECK_AFTER_DRAIN,
    )
    from workflows.failures import activity_cause, describe, is_bad_deploy
    from workflows.options import API_CALL, API_RETRY, LOOK_AGAIN_CALL, LOOK_AGAIN_RETRY, WAIT_RETRY

from workflows.disruption_state import DisruptionState

# A forceful replacement is launched at most this often (the first launch and its relaunches), and
# launched again only with this much of its deadline left: bounded, however often instances end.
MAX_LAUNCHES = 3
RELAUNCH_MIN_TIME_LEFT = timedelta(seconds=30)


class ReplacementFailed(Exception):
    """One replacement could not be provided; the message says which and in what state."""


class DisruptionReplacements(DisruptionState):
    """Launch (or ask Karpenter for) each replacement and wait until it is ready."""

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
