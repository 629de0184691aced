"""NotificationWorkflow: one message to the operator's webhook, delivered durably and never in the
way of the command it is about (issue 35 item 4; docs/operator-controls.md "Notifications").

A workflow that has something to say calls `notify(...)`: it starts this workflow as a child with
parent-close policy ABANDON and does not wait for it, so a slow or broken webhook never holds up a
drain, an approval or a rollout, and a command that ends (or fails) still has its message delivered.
The send is an activity retried with backoff for up to NOTIFY_FOR (a webhook down for an hour still
gets the message); what the webhook refuses for good (a 4xx, a missing Secret) ends it at once. The
child's id is the source workflow's run and the event: a replayed or retried start never sends twice.
"""

from __future__ import annotations

from datetime import timedelta
from typing import ClassVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from activities.notifications import NotificationActivities
    from api.notifications import Notification, NotificationResult

NOTIFY_FOR = timedelta(hours=6)
NOTIFY_ATTEMPT = timedelta(seconds=30)
NOTIFY_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=5),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(minutes=5),
    non_retryable_error_types=["NotificationMisconfigured", "WebhookRefused"],
)


@workflow.defn(name="NotificationWorkflow")
class NotificationWorkflow:
    # The fault matrix's cells (tests/unit/workflows/fault_matrix.py), as on every workflow.
    ACTIVITIES: ClassVar[tuple[str, ...]] = ("send_notification",)
    CHILDREN: ClassVar[tuple[str, ...]] = ()

    @workflow.run
    async def run(self, notification: Notification) -> NotificationResult:
        return await workflow.execute_activity_method(
            NotificationActivities.send_notification,
            notification,
            start_to_close_timeout=NOTIFY_ATTEMPT,
            schedule_to_close_timeout=NOTIFY_FOR,
            retry_policy=NOTIFY_RETRY,
            summary=f"{notification.event}: {notification.text[:80]}",
        )


def notification_id(notification: Notification) -> str:
    info = workflow.info()
    return f"notify/{info.workflow_id}/{info.run_id[:8]}/{notification.event}"


async def notify(notification: Notification) -> None:
    """Start the notification's delivery and go on (never raises but for a cancel of the caller)."""
    try:
        await workflow.start_child_workflow(
            NotificationWorkflow.run,
            notification,
            id=notification_id(notification),
            parent_close_policy=ParentClosePolicy.ABANDON,
            static_summary=f"{notification.event}: {notification.text[:120]}",
        )
    except WorkflowAlreadyStartedError:
        pass  # this run already sent it
    except Exception as err:  # a message is never worth failing the command it is about
        workflow.logger.warning("notification %s not started: %s", notification.event, err)
