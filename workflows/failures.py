"""Reading failures that come back from activities.

Imported inside `workflow.unsafe.imports_passed_through()`: no side effects.
"""

from __future__ import annotations

from temporalio.exceptions import ActivityError


def activity_cause(err: BaseException) -> BaseException:
    """The error an activity raised when `err` wraps one (ActivityError with a cause), else `err`."""
    return err.cause if isinstance(err, ActivityError) and err.cause else err
