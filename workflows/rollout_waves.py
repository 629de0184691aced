"""A RolloutWorkflow with a policy: waves, each held to a health gate (issue 35; api/rollout_policy.py).

The rollout's nodes are known from the start (`karpflow rollout`: the pool's nodes created before the
request; drift: the pool's drifted nodes when the controller started it). Each wave:

1. `mark_rollout_wave` marks the next nodes: the canary first, then each wave `growth` times the
   last (at most `maxWave`), from one zone at a time after the canary when `zoneByZone`. The
   controller replaces marked nodes as drift, within every control drift has;
2. every poll, `rollout_remaining` says which of them are gone and `check_wave_health` judges the
   pool's nodes created since the wave began (the replacements) and their pods;
3. once the wave's nodes are gone the soak begins; the wave passes when the gate is Healthy after
   `soak`. A Failed verdict at any time halts the rollout: the wave's unreplaced nodes are unmarked,
   the NodePool's `karpflow.dev/rollout-state` says Halted (the planner then drifts no node of the
   pool toward that target), an Event, a metric and a notification say so, and the rollout waits for
   `resume` (the next wave goes) or `abort` (marks off; `rollback` marks the nodes the rollout
   launched, so they are replaced from the pool's spec as it is now: revert the change first).

A drift rollout whose pool moves on to another target (the user fixed the AMI) ends Superseded: the
new target's rollout takes the pool's drifted nodes, its own first. The wave state travels in the
input across continues-as-new, so a rollout lasts as long as its pool needs.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import Protocol

from temporalio import workflow
from temporalio.exceptions import ActivityError, is_cancelled_exception
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from api.notifications import Notification
    from api.rollout_health_io import WaveHealth, WaveHealthRequest
    from api.rollout_io import (
        AbortRequest,
        MarkWaveRequest,
        RolloutInput,
        RolloutNode,
        RolloutPhase,
        RolloutStatus,
        StateAnswer,
        StateRequest,
        WaveState,
    )
    from api.rollout_policy import RolloutPolicy
    from workflows.failures import describe
    from workflows.options import API_CALL, API_RETRY
    from workflows.workflow_metrics import count_wave

from workflows.notify import notify


class RolloutFlow(Protocol):
    """What the waves use of their RolloutWorkflow (workflows/rollout.py), without importing it."""

    abort_request: AbortRequest | None
    resume_requested: bool

    @property
    def status_(self) -> RolloutStatus: ...

    def set_phase(self, phase: RolloutPhase) -> None: ...

    def show(self, nodes: list[RolloutNode]) -> None: ...

    async def remaining(
        self,
        request: RolloutInput,
        rollout_id: str,
        nodes: list[RolloutNode],
        remark: list[str] | None = None,
    ) -> list[RolloutNode]: ...

    async def unmark_nodes(
        self, request: RolloutInput, rollout_id: str, nodes: list[RolloutNode] | None
    ) -> None: ...


# The gate's reasons shown in the status and the Event: enough to act on, short enough for a line.
_SHOWN_REASONS = 5


def next_wave(
    policy: RolloutPolicy, total: int, wave: int, remaining: list[RolloutNode]
) -> list[RolloutNode]:
    """The nodes of wave `wave + 1` among `remaining` (by name; one zone after the canary when
    zone by zone: the first zone, by name, that still has nodes)."""
    sizes = policy.wave_sizes(max(total, len(remaining), 1))
    size = sizes[min(wave, len(sizes) - 1)]
    pool = sorted(remaining, key=lambda n: n.name)
    if policy.zone_by_zone and wave >= 1:
        zones = sorted({n.zone for n in pool})
        if zones:
            pool = [n for n in pool if n.zone == zones[0]]
    return pool[:size]


class Waves:
    """The wave loop of one RolloutWorkflow run (its status is the workflow's)."""

    def __init__(self, flow: RolloutFlow, request: RolloutInput) -> None:
        assert request.policy is not None and request.nodes is not None
        self.flow = flow
        self.request = request
        self.policy: RolloutPolicy = request.policy
        self.state: WaveState = request.waves.model_copy(deep=True)
        self.nodes: list[RolloutNode] = list(request.nodes)
        self.rollout_id = workflow.info().workflow_id
        self.cancelled = False  # the run's cancel came: what is written now is its compensation

    @property
    def status(self) -> RolloutStatus:
        return self.flow.status_

    async def run(self) -> RolloutStatus:
        try:
            return await self._run()
        except BaseException as err:
            # A cancelled drift rollout (its marks come off in rollout.py) must not leave the pool's
            # state saying Rolling or Halted: the planner would hold the pool's drift toward the target
            # for a rollout that no longer runs, and start none (fault matrix, rollout/*: cancelled).
            # Aborted is what the operator's stop means to the planner: nothing drifts toward it.
            if is_cancelled_exception(err) and self.request.target:
                self.cancelled = True
                await self._sync("Aborted", reason="the rollout was cancelled")
            raise

    def _check_cancel(self) -> None:
        """A call that finished despite the run's cancel returns its result and swallows the
        cancellation (WAIT_CANCELLATION_COMPLETED): look for it, so the compensation comes after it."""
        if not self.cancelled and workflow.cancellation_reason() is not None:
            raise asyncio.CancelledError("workflow cancellation requested")

    async def _run(self) -> RolloutStatus:
        request = self.request
        self.status.mode, self.status.target, self.status.policy = request.mode, request.target, self.policy
        self._restore()
        for _ in range(request.polls_per_run):
            if self.flow.abort_request is not None:
                return await self._abort()
            if self.state.halted:
                if self.flow.resume_requested:
                    self.flow.resume_requested = False
                    self.state.halted, self.state.gate = "", []
                    self.status.halted = ""
                elif await self._halted_poll():
                    return self.status
                else:
                    continue
            ended = await self._step()
            if ended:
                return self.status
            if workflow.info().is_continue_as_new_suggested():
                break
            await self._wait(request.poll_interval)
        workflow.continue_as_new(request.model_copy(update={"nodes": self.nodes, "waves": self.state}))

    def _restore(self) -> None:
        """A run after a continue-as-new shows where the waves are (the status is new each run): else
        its query and Phase said Rolling at wave 0 while it soaked or was halted, and `resume`, which
        only a Halted phase takes, was ignored for ever (fault matrix, rollout/waves)."""
        state = self.state
        if state.wave == 0:
            return
        self.status.wave, self.status.wave_nodes = state.wave, [n.name for n in state.marked]
        self.status.gate, self.status.halted = list(state.gate), state.halted
        if state.soak_started is not None:
            self.status.soak_until = state.soak_started + self.policy.soak
        self._set("Halted" if state.halted else "Soaking" if state.soak_started is not None else "Rolling")

    async def _step(self) -> bool:
        """One poll: mark the next wave, or follow the one in progress. True: the rollout ended."""
        state = self.state
        self.nodes = await self.flow.remaining(
            self.request, self.rollout_id, self.nodes, remark=[n.uid for n in state.marked]
        )
        self.flow.show(self.nodes)
        if not state.marked:
            if not self.nodes:
                await self._succeed()
                return True
            await self._start_wave()
            return False
        present = {n.uid for n in self.nodes}
        left = [n for n in state.marked if n.uid in present]
        self.status.wave_nodes = [n.name for n in left]
        health = await self._check()
        if health is not None:
            self._judged(health)
            if health.verdict == "Failed":
                await self._halt(left, health)
                return False
        if left:
            self._set("Rolling")
            return False
        now = workflow.now()
        if state.soak_started is None:
            state.soak_started = now
            self.status.soak_until = now + self.policy.soak
            self._set("Soaking")
            await self._sync("Soaking")
            return False
        soaked = now - state.soak_started >= self.policy.soak
        if soaked and health is not None and health.verdict == "Healthy":
            count_wave(self.request.nodepool, "passed")
            self.status.message = f"wave {state.wave} passed its gate after a soak of {self.policy.soak}"
            state.marked, state.soak_started, state.gate = [], None, []
            self.status.soak_until, self.status.gate = None, []
        return False

    async def _start_wave(self) -> None:
        state = self.state
        pick = next_wave(self.policy, self.request.total, state.wave, self.nodes)
        marked = await self._mark(pick)
        if marked is None:
            return  # shown; the next poll tries again
        state.wave += 1
        state.began = workflow.now()
        state.marked, state.soak_started, state.gate = marked, None, []
        self.status.wave, self.status.wave_nodes = state.wave, [n.name for n in marked]
        self.status.soak_until, self.status.gate = None, []
        self.status.message = f"wave {state.wave}: {len(marked)} node(s) marked"
        count_wave(self.request.nodepool, "started")
        self._set("Rolling")
        await self._sync("Rolling", reason=f"{len(marked)} node(s): {', '.join(n.name for n in marked[:10])}")

    async def _mark(self, nodes: list[RolloutNode]) -> list[RolloutNode] | None:
        """Mark the wave; a failure marks nothing this poll (the next one tries again)."""
        try:
            marked: list[RolloutNode] = await workflow.execute_activity(
                "mark_rollout_wave",
                MarkWaveRequest(rollout_id=self.rollout_id, nodepool=self.request.nodepool, nodes=nodes),
                result_type=list[RolloutNode],
                start_to_close_timeout=API_CALL,
                heartbeat_timeout=API_CALL,
                retry_policy=API_RETRY,
                # A cancel waits for the marking to end, so the unmarking after it sees every mark it
                # made (else a mark could land after the unmark: a node replaced that nothing follows).
                cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                summary=f"mark wave {self.state.wave + 1}: {len(nodes)} node(s)",
            )
            self._check_cancel()
            return marked
        except ActivityError as err:
            if is_cancelled_exception(err):
                raise
            self.status.message = f"marking wave {self.state.wave + 1} failed, tried again: {describe(err)}"
            return None

    async def _check(self) -> WaveHealth | None:
        """The gate's verdict on the wave so far; None when it cannot be asked (shown, asked again)."""
        state = self.state
        assert state.began is not None
        try:
            health: WaveHealth = await workflow.execute_activity(
                "check_wave_health",
                WaveHealthRequest(
                    rollout_id=self.rollout_id,
                    nodepool=self.request.nodepool,
                    since=state.began,
                    policy=self.policy,
                    soak_started=state.soak_started,
                ),
                result_type=WaveHealth,
                start_to_close_timeout=API_CALL,
                retry_policy=API_RETRY,
                summary=f"gate of wave {state.wave}",
            )
            return health
        except ActivityError as err:
            if is_cancelled_exception(err):
                raise
            self.status.message = f"the gate could not be checked, asked again: {describe(err)}"
            return None

    def _judged(self, health: WaveHealth) -> None:
        state = self.state
        known = {n.uid for n in state.launched}
        state.launched.extend(n for n in health.nodes if n.uid not in known)
        state.gate = health.reasons[:_SHOWN_REASONS]
        self.status.gate = list(state.gate)

    async def _halt(self, left: list[RolloutNode], health: WaveHealth) -> None:
        state = self.state
        why = "; ".join(health.reasons[:_SHOWN_REASONS]) or "the gate failed"
        state.halted = why
        if left:
            await self.flow.unmark_nodes(self.request, self.rollout_id, left)
        state.marked, state.soak_started = [], None
        self.status.halted, self.status.wave_nodes, self.status.soak_until = why, [], None
        self.status.message = f"wave {state.wave} failed its gate: resume or abort (`karpflow rollout`)"
        count_wave(self.request.nodepool, "halted")
        self._set("Halted")
        await self._sync("Halted", reason=why)
        if self.request.notify:
            await notify(
                Notification(
                    event="RolloutHalted",
                    workflow_id=self.rollout_id,
                    text=f"rollout of {self.request.nodepool} halted at wave {state.wave}: {why}",
                    nodepool=self.request.nodepool,
                )
            )

    async def _halted_poll(self) -> bool:
        """While halted: has the pool moved on (True: ended Superseded)? Else wait for a signal."""
        answer = await self._sync("Halted", reason=self.state.halted, event=False)
        if answer is not None and answer.superseded:
            await self._supersede(answer)
            return True
        await self._wait(self.request.poll_interval)
        return False

    async def _supersede(self, answer: StateAnswer) -> None:
        await self.flow.unmark_nodes(self.request, self.rollout_id, None)
        self.status.message = (
            f"NodePool {self.request.nodepool} moved on to target {answer.target}: its rollout takes over"
        )
        self._set("Superseded")

    async def _abort(self) -> RolloutStatus:
        abort = self.flow.abort_request
        assert abort is not None
        await self.flow.unmark_nodes(self.request, self.rollout_id, None)
        rolled = ""
        if abort.rollback and self.state.launched:
            try:
                back = await workflow.execute_activity(
                    "mark_rollout_wave",
                    MarkWaveRequest(
                        rollout_id=self.rollout_id, nodepool=self.request.nodepool, nodes=self.state.launched
                    ),
                    result_type=list[RolloutNode],
                    start_to_close_timeout=API_CALL,
                    heartbeat_timeout=API_CALL,
                    retry_policy=API_RETRY,
                    summary=f"roll back: mark {len(self.state.launched)} node(s) the rollout launched",
                )
                rolled = f"; {len(back)} node(s) it launched marked for replacement"
            except ActivityError as err:
                if is_cancelled_exception(err):
                    raise
                rolled = f"; marking its nodes for the rollback failed: {describe(err)}"
        by = f" by {abort.by}" if abort.by else ""
        self.status.message = f"aborted{by} at wave {self.state.wave}{rolled}"
        self._set("Aborted")
        await self._sync("Aborted", reason=self.status.message)
        return self.status

    async def _succeed(self) -> None:
        self.status.message = f"all {self.status.total} node(s) replaced in {self.state.wave} wave(s)"
        self._set("Succeeded")
        await self._sync("Succeeded", reason=self.status.message)
        if self.request.notify:
            await notify(
                Notification(
                    event="RolloutFinished",
                    workflow_id=self.rollout_id,
                    text=f"rollout of {self.request.nodepool} finished: {self.status.message}",
                    nodepool=self.request.nodepool,
                )
            )

    async def _sync(self, phase: str, reason: str = "", event: bool = True) -> StateAnswer | None:
        """The NodePool's rollout state (drift rollouts) and the phase's Event; a failure is shown and
        the next change writes it again (the planner holds drift in the meantime: no state is no
        permission)."""
        try:
            answer: StateAnswer = await workflow.execute_activity(
                "sync_rollout_state",
                StateRequest(
                    rollout_id=self.rollout_id,
                    nodepool=self.request.nodepool,
                    target=self.request.target,
                    phase=phase,
                    wave=self.state.wave,
                    reason=reason,
                    event=event,
                ),
                result_type=StateAnswer,
                start_to_close_timeout=API_CALL,
                retry_policy=API_RETRY,
                # A cancel waits for the write to end (it never heartbeats, so it runs to its end
                # anyway): else a Rolling written late replaced the Aborted the cancel writes.
                cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                summary=f"rollout state: {phase}",
            )
            self._check_cancel()
            return answer
        except ActivityError as err:
            if is_cancelled_exception(err):
                raise
            self.status.message = f"the NodePool's rollout state could not be written: {describe(err)}"
            return None

    async def _wait(self, interval: timedelta) -> None:
        """The poll's pause; a signal (abort, resume) ends it at once."""
        with contextlib.suppress(TimeoutError):  # the poll's time passed: nothing was signalled
            await workflow.wait_condition(
                lambda: self.flow.abort_request is not None or self.flow.resume_requested, timeout=interval
            )

    def _set(self, phase: RolloutPhase) -> None:
        if self.status.phase != phase:
            self.flow.set_phase(phase)
