"""Reading failures that come back from activities and child workflows.

Temporal wraps what an activity raised in an ActivityError ("Activity task failed"), and what a child
workflow raised in a ChildWorkflowError ("Child Workflow execution failed"), each with the real error
as its `cause`. A message that keeps only the wrapper says nothing; these helpers quote the innermost
cause, with its type, and say where it came from.

Imported inside `workflow.unsafe.imports_passed_through()`: no side effects.
"""

from __future__ import annotations

from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

MESSAGE_LIMIT = 1000  # a failure message is read in the Web UI and in `karpflow status`


def activity_cause(err: BaseException) -> BaseException:
    """The error an activity raised when `err` wraps one (ActivityError with a cause), else `err`."""
    return err.cause if isinstance(err, ActivityError) and err.cause else err


def innermost(err: BaseException) -> BaseException:
    """The error at the end of the `cause` chain (what was raised first)."""
    while getattr(err, "cause", None) is not None:
        err = err.cause  # type: ignore[attr-defined]
    return err


def one_line(err: BaseException) -> str:
    """The innermost cause as one line: its type, when it has one, and its message."""
    err = innermost(err)
    kind = err.type if isinstance(err, ApplicationError) else type(err).__name__
    text = err.message if isinstance(err, ApplicationError) else str(err)
    text = " ".join(text.split())
    return f"{kind}: {text}" if kind else text


def where(err: BaseException) -> list[str]:
    """The activities and child workflows the failure came through, outermost first."""
    places = []
    while err is not None:
        if isinstance(err, ActivityError):
            places.append(f"activity {err.activity_type}")
        elif isinstance(err, ChildWorkflowError):
            places.append(f"{err.workflow_type} {err.workflow_id}")
        err = getattr(err, "cause", None)  # type: ignore[assignment]
    return places


def describe(err: BaseException) -> str:
    """Where the failure came from and its innermost cause, quoted: e.g. `TerminationWorkflow
    termination/c/n/u, activity terminate_instance: InstanceNotOwned: instance i-0abc is not tagged
    for cluster c`."""
    places = where(err)
    text = one_line(err)
    return (f"{', '.join(places)}: {text}" if places else text)[:MESSAGE_LIMIT]
