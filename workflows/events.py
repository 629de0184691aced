"""Kubernetes Events from workflow code, in one call: for what only a workflow knows at that moment
(a termination that failed, an approval it waits for). Events an activity can record where it acts
are recorded there, which costs no history (kube/events.py, `recorder_for(kube)`).

    await record_event("Node", node, Reason.FAILED_TERMINATION, message, uid=pinned_uid)
    await awaiting_approval(candidates, command_id)            # the approval gate
    await waiting_node_disruption_budget(node, "ingress", why)  # a termination's NDB gate

Best effort like every Event: a failure is logged, never raised, and never holds the workflow up for
long. Calling it adds an activity to the workflow's commands: behind `workflow.patched` in a workflow
that may be running already (docs/workflow-changes.md).

Imported by workflow modules: no side effects at import.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta
from typing import Literal

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from api.activity_io import NodeRef
    from api.event_reasons import Reason, RecordEventRequest, awaiting_approval_message

EVENT_TIMEOUT = timedelta(seconds=15)
EVENT_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=3)


async def record_event(
    kind: Literal["Node", "Pod", "NodePool"],
    name: str,
    reason: Reason,
    message: str,
    *,
    namespace: str = "",
    uid: str | None = None,
) -> None:
    """Record one Event through the `record_event` activity (registered on every worker)."""
    request = RecordEventRequest(
        kind=kind, name=name, namespace=namespace, uid=uid or "", reason=reason, message=message[:1024]
    )
    try:
        await workflow.execute_activity(
            "record_event",
            request,
            result_type=str,
            start_to_close_timeout=EVENT_TIMEOUT,
            retry_policy=EVENT_RETRY,
            summary=f"Event {reason} on {kind} {name}",
        )
    except ActivityError as err:
        if is_cancelled_exception(err):
            raise
        workflow.logger.info("Event %s on %s %s not recorded: %s", reason, kind, name, err)


async def awaiting_approval(nodes: Sequence[NodeRef], command: str) -> None:
    """DisruptionAwaitingApproval on each node a command waits to disrupt, in the words the controller's
    pass uses for the same wait (so the recorder counts the two as one Event)."""
    message = awaiting_approval_message(command)
    await asyncio.gather(
        *(
            record_event("Node", n.node, Reason.DISRUPTION_AWAITING_APPROVAL, message, uid=n.uid)
            for n in nodes
        )
    )


async def waiting_node_disruption_budget(node: NodeRef, budget: str, why: str) -> None:
    """DisruptionWaitingNodeDisruptionBudget on a node whose termination waits for `budget`; `why` is the
    budget's own account (e.g. the planner's "NodeDisruptionBudget ingress allows 0 (...)")."""
    message = why if budget in why else f"NodeDisruptionBudget {budget}: {why}"
    await record_event(
        "Node", node.node, Reason.DISRUPTION_WAITING_NODE_DISRUPTION_BUDGET, message, uid=node.uid
    )
