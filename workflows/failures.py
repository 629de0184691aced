"""Reading failures that come back from activities and child workflows.

Temporal wraps what an activity raised in an ActivityError ("Activity task failed"), and what a child
workflow raised in a ChildWorkflowError ("Child Workflow execution failed"), each with the real error
as its `cause`. A message that keeps only the wrapper says nothing; these helpers quote the innermost
cause, with its type, and say where it came from.

It also says which exceptions end a run (docs/workflow-changes.md, "When a workflow fails"):
`WORKFLOW_BUGS` fail the run of a workflow that lists them in `failure_exception_types` (its
compensation runs first), while a NondeterminismError always fails only the workflow task, which
Temporal retries until code that matches the history is deployed (`is_bad_deploy`).

Imported inside `workflow.unsafe.imports_passed_through()`: no side effects.
"""

from __future__ import annotations

from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError
from temporalio.workflow import NondeterminismError

MESSAGE_LIMIT = 1000  # a failure message is read in the Web UI and in `karpflow status`

# A bug in workflow code (a wrong argument, a missing attribute or key, a bad value, a broken
# assumption). Listed in `@workflow.defn(failure_exception_types=...)` they fail the run, visibly,
# and free what it holds, instead of failing its workflow task for ever (which no one sees but the
# worker's log). Never `Exception`: Temporal would then fail the run on a nondeterminism too (any
# listed type that NondeterminismError subclasses does), and a bad deploy would kill every
# workflow it replays instead of waiting for the fix.
WORKFLOW_BUGS: tuple[type[Exception], ...] = (
    AttributeError,
    TypeError,
    LookupError,
    ValueError,
    AssertionError,
    NameError,
    ArithmeticError,
)


def is_bad_deploy(err: BaseException) -> bool:
    """A NondeterminismError (the sandbox's refusals are one: RestrictedWorkflowAccessError): the code
    does not match the history. A handler must re-raise it untouched, never compensate or fail the
    run for it: the workflow task fails and is retried until matching code runs it, and whatever a
    compensation started would be thrown away with the failed task anyway."""
    return isinstance(err, NondeterminismError)


def activity_cause(err: BaseException) -> BaseException:
    """The error an activity raised when `err` wraps one (ActivityError with a cause), else `err`."""
    return err.cause if isinstance(err, ActivityError) and err.cause else err


def innermost(err: BaseException) -> BaseException:
    """The error at the end of the `cause` chain (what was raised first)."""
    while (cause := getattr(err, "cause", None)) is not None:
        err = cause
    return err


def one_line(err: BaseException) -> str:
    """The innermost cause as one line: its type, when it has one, and its message."""
    err = innermost(err)
    kind = err.type if isinstance(err, ApplicationError) else type(err).__name__
    text = err.message if isinstance(err, ApplicationError) else str(err)
    text = " ".join(text.split())
    return f"{kind}: {text}" if kind else text


def where(err: BaseException | None) -> list[str]:
    """The activities and child workflows the failure came through, outermost first."""
    places = []
    while err is not None:
        if isinstance(err, ActivityError):
            places.append(f"activity {err.activity_type}")
        elif isinstance(err, ChildWorkflowError):
            places.append(f"{err.workflow_type} {err.workflow_id}")
        err = getattr(err, "cause", None)
    return places


def describe(err: BaseException) -> str:
    """Where the failure came from and its innermost cause, quoted: e.g. `TerminationWorkflow
    termination/c/n/u, activity terminate_instance: InstanceNotOwned: instance i-0abc is not tagged
    for cluster c`."""
    try:
        places = where(err)
        text = one_line(err)
    except WORKFLOW_BUGS as bug:  # a description must never be why a failure goes unhandled
        places, text = [], f"{type(err).__name__}: {err} (not described: {type(bug).__name__}: {bug})"
    return (f"{', '.join(places)}: {text}" if places else text)[:MESSAGE_LIMIT]
