"""What is in flight: the running DisruptionWorkflows and TerminationWorkflows of a task queue, read
from Temporal visibility, and which of them holds each node.

One definition for every reader that must agree on it: the controller's passes and validations
(activities/planning.py), the judgement of a command that waited (activities/waiting_commands.py),
`karpflow disrupt` (which holds these nodes out of its plan exactly as a pass does, and names their
holder) and `karpflow status` (which lists what is in flight now, not what was at the last pass).
"""

from __future__ import annotations

from temporalio.client import Client

from api import search_attributes as sa

WORKFLOW_TYPES = ("DisruptionWorkflow", "TerminationWorkflow")


class InFlight:
    """Running disruption and termination workflows, and which of them holds each node."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.holders: dict[str, tuple[str, str]] = {}  # node -> (workflow id, phase)

    @property
    def nodes(self) -> set[str]:
        return set(self.holders)


def running_query(task_queue: str) -> str:
    """The visibility query of the workflows that hold nodes on `task_queue` (another cluster's
    worker may share the namespace, never the task queue)."""
    types = ", ".join(f"'{t}'" for t in WORKFLOW_TYPES)
    return f"WorkflowType IN ({types}) AND ExecutionStatus = 'Running' AND TaskQueue = '{task_queue}'"


async def read_in_flight(client: Client, task_queue: str) -> InFlight:
    """The running disruption and termination workflows of `task_queue`, and the nodes they hold
    (with the phase each is in: its KarpflowPhase search attribute)."""
    found = InFlight()
    async for execution in client.list_workflows(running_query(task_queue)):
        found.ids.append(execution.id)
        phase = execution.typed_search_attributes.get(sa.PHASE) or ""
        for node in execution.typed_search_attributes.get(sa.NODES) or ():
            # A disruption names its candidates and starts their terminations: name the disruption.
            if node not in found.holders or execution.workflow_type == "DisruptionWorkflow":
                found.holders[node] = (execution.id, phase)
    found.ids.sort()
    return found
