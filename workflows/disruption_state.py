"""What the parts of DisruptionWorkflow share: the state of one run, and the helpers they all call.

The workflow is one class (disruption.py: the runbook, its handlers and how it calls activities and
publishes its phase) that inherits its parts: the approval of a waiting command
(disruption_approval.py), providing the replacements (disruption_replacements.py) and the
compensation (disruption_rollback.py). Each part inherits `DisruptionState`, so its reads are checked
against the state set here; the methods one part calls in another are declared here for the type
checker only (at run time they are the parts' own; disruption.py has the type checker refuse a
DisruptionWorkflow that lacks one)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from temporalio import workflow
from temporalio.common import SearchAttributeUpdate
from temporalio.exceptions import ApplicationError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from api.activity_io import LaunchedInstance, LaunchTemplate, NodeRef
    from api.workflow_io import (
        ApprovalDecision,
        DisruptionPhase,
        DisruptionStatus,
        ReplacementStatus,
        UnavailableOffering,
    )
    from api.workflow_summaries import short_node

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


def nodes_summary(names: list[str]) -> str:
    """For an activity's one-line summary: `ip-10-0-1-2`, or `3 nodes`."""
    return short_node(names[0]) if len(names) == 1 else f"{len(names)} nodes"


class DisruptionState:
    """The state of one DisruptionWorkflow run, which every part reads and writes."""

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
        self._notify = False  # the command asked for webhook notifications (DisruptionInput.notify)
        self._check_problem = ""  # why the last check of a waiting command could not be made
        self._rolling_back = False  # the compensation has begun (a bug in it must not start it again)
        self._claims_created = 0  # replacement NodeClaims created (PATCH_NODECLAIM_ONE_WAIT)
        # Forceful commands: per replacement index, the launches that failed and were discarded before
        # the one in flight ("<offering>: <why>"; PATCH_FORCEFUL_RELAUNCH).
        self._failed_launches: dict[int, list[str]] = {}
        self._templates: dict[int, LaunchTemplate] = {}  # each replacement's, as resolved

    if TYPE_CHECKING:
        # disruption.py: phases, search attributes, activity calls, the candidates as pinned
        @abstractmethod
        def _set_phase(self, phase: DisruptionPhase) -> None: ...

        @abstractmethod
        def _upsert(self, *updates: SearchAttributeUpdate[Any]) -> None: ...

        @abstractmethod
        def _publish(self) -> None: ...

        @abstractmethod
        async def _call(self, activity: Callable[..., Awaitable[T]], arg: Any, **options: Any) -> T: ...

        @abstractmethod
        async def _regular(self, activity: Callable[..., Awaitable[T]], arg: Any, **options: Any) -> T: ...

        @abstractmethod
        def _pinned(self) -> list[NodeRef]: ...

        @abstractmethod
        def _failure_text(self, err: BaseException) -> str: ...

        # disruption_rollback.py: what a relaunch discards
        @abstractmethod
        async def _discard(self, instance: LaunchedInstance) -> None: ...

        @staticmethod
        @abstractmethod
        def _known_instance(replacement: ReplacementStatus) -> LaunchedInstance: ...
