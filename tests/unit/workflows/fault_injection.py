"""Faults the fake activities can be made to suffer, one activity of one workflow type at a time.

Every fake activity (fakes.py, controller_fakes.py, rollout_fakes.py) calls `FaultInjector.enter`
first, under its real activity name. A fault armed for (workflow type, activity) then acts on that
call: the same activity called by another workflow type (terminate_instance by a disruption's
rollback and by a termination) is left alone. The fault matrix (test_fault_matrix.py) arms one per
cell; other tests use `refuse` for one permanent failure.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import errors


class Fault(StrEnum):
    """What happens to the activity (or child workflow) of a cell."""

    PERMANENT = "fails permanently"
    EXHAUSTED = "exhausts its retries"
    START_TO_CLOSE = "times out (start-to-close)"
    HEARTBEAT = "times out (heartbeat)"
    CANCELLED = "workflow cancelled while it runs"
    WORKER_KILLED = "worker killed while it runs"
    # Children (a TerminationWorkflow under its DisruptionWorkflow, a DisruptionWorkflow under the
    # controller): what is done to the child run from outside, or what it ends in.
    CHILD_FAILS = "child fails"
    CHILD_TERMINATED = "child terminated from outside"
    CHILD_CANCELLED = "child cancelled from outside"


# A retryable failure comes back at once on the next attempt: the attempts are what is tested, and
# the backoff (server side for a regular activity, in the worker for a local one) is taken short.
RETRY_AT_ONCE = timedelta(milliseconds=10)
# Faults that hang one attempt until something ends it (a timeout, the cancel, the worker's stop).
HANGING = frozenset({Fault.START_TO_CLOSE, Fault.HEARTBEAT, Fault.CANCELLED, Fault.WORKER_KILLED})


@dataclass
class Armed:
    workflow_type: str
    activity: str
    fault: Fault
    message: str = ""
    calls: int = 0
    heartbeat_timeouts: list[timedelta | None] = field(default_factory=list)
    locals: list[bool] = field(default_factory=list)
    from_call: int = 1  # the call it hits first (2: the regular wait after a first local look)
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    # CANCELLED: set once the workflow's cancel is sent; the call in flight then finishes its work
    # (unless the cancel reached it first through a heartbeat), as a real call that was under way does.
    released: asyncio.Event = field(default_factory=asyncio.Event)
    cleared: bool = False  # the fault is over: calls from now on succeed (a wait that ends)
    workflow_ids: list[str] = field(default_factory=list)  # the runs it hit (a child's id, found so)


class FaultInjector:
    def __init__(self) -> None:
        self.armed: dict[str, Armed] = {}
        self.entered: Counter[str] = Counter()  # calls of each activity, faulted or not
        self.started: Counter[str] = Counter()  # first attempts of each activity, faulted or not
        self.seen: dict[tuple[str, str], timedelta | None] = {}  # (workflow type, activity) -> heartbeat

    def arm(
        self, workflow_type: str, name: str, fault: Fault, message: str = "", from_call: int = 1
    ) -> Armed:
        armed = Armed(workflow_type, name, fault, message, from_call=from_call)
        self.armed[name] = armed
        return armed

    def refuse(self, workflow_type: str, name: str, message: str) -> Armed:
        """`name` fails for good in `workflow_type`, with this message (a 400 from a webhook, say)."""
        return self.arm(workflow_type, name, Fault.PERMANENT, message)

    async def enter(self, name: str) -> None:
        if not activity.in_activity():
            return
        info = activity.info()
        self.entered[name] += 1
        if info.attempt == 1:
            self.started[name] += 1  # a call, not a retry
        self.seen[(info.workflow_type or "", name)] = info.heartbeat_timeout
        armed = self.armed.get(name)
        if armed is None or armed.cleared or info.workflow_type != armed.workflow_type:
            return
        armed.calls += 1
        if armed.calls < armed.from_call:
            return
        armed.heartbeat_timeouts.append(info.heartbeat_timeout)
        armed.workflow_ids.append(info.workflow_id or "")
        armed.locals.append(info.is_local)
        armed.reached.set()
        fault = armed.fault
        if fault == Fault.PERMANENT:
            raise ApplicationError(
                armed.message or f"{name}: refused (fault matrix)", type=errors.INVALID, non_retryable=True
            )
        if fault == Fault.EXHAUSTED:
            raise ApplicationError(
                armed.message or f"{name}: API unavailable (fault matrix)",
                type=errors.UNAVAILABLE,
                next_retry_delay=RETRY_AT_ONCE,
            )
        if fault in HANGING and armed.calls == armed.from_call:
            # One attempt hangs; the next succeeds. A start-to-close timeout needs it to heartbeat (or
            # its heartbeat timeout would fire first); the cancel reaches a regular activity only
            # through a heartbeat; a heartbeat timeout needs it silent.
            beating = fault != Fault.HEARTBEAT and not info.is_local
            # A local activity is cancelled by the worker itself when the cancel reaches the workflow; a
            # regular one without a heartbeat timeout hears of it only after its throttled heartbeat
            # (30 s): that one finishes its call once the cancel is sent.
            while not (fault == Fault.CANCELLED and armed.released.is_set() and not info.is_local):
                if beating:
                    activity.heartbeat({"fault": str(fault)})
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)  # the cancel has had time to reach it; the call finishes
