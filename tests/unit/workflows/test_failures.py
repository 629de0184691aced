"""workflows/failures.py: what a failed activity or child workflow is quoted as."""

from __future__ import annotations

from temporalio.exceptions import ApplicationError, ChildWorkflowError

from workflows.failures import describe, where


def test_a_failed_child_is_named_by_its_type_and_workflow_id():
    """A candidate's failed termination comes back as a ChildWorkflowError; quoting it must not raise
    (it did: `err.id` is no attribute of temporalio's ChildWorkflowError, and the AttributeError
    failed the disruption's workflow task on every attempt)."""
    child = ChildWorkflowError(
        "Child Workflow execution failed",
        namespace="default",
        workflow_id="termination/c/n1/uid-1",
        run_id="run-1",
        workflow_type="TerminationWorkflow",
        initiated_event_id=5,
        started_event_id=6,
        retry_state=None,
    )
    child.__cause__ = ApplicationError("instance i-1 is not ours", type="NotOwned")

    assert where(child) == ["TerminationWorkflow termination/c/n1/uid-1"]
    assert describe(child) == "TerminationWorkflow termination/c/n1/uid-1: NotOwned: instance i-1 is not ours"
