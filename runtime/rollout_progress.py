"""The running rollouts of a cluster and their progress, from Temporal visibility and each one's memo
(`karpflow status` lists them, in its JSON too; `karpflow rollout --status ID` asks one for its full
status)."""

from __future__ import annotations

from pydantic import BaseModel
from temporalio.client import Client


class RolloutProgress(BaseModel):
    """What a running rollout's memo says of it."""

    id: str
    phase: str = "Marking"
    replaced: int = 0
    total: int = 0
    remaining: int = 0

    def line(self) -> str:
        return f"{self.id}: {self.phase}, {self.replaced}/{self.total} replaced, {self.remaining} remaining"


async def running_rollouts(client: Client, cluster: str) -> list[RolloutProgress]:
    """Every running RolloutWorkflow of `cluster`, by id."""
    prefix = f"rollout/{cluster}/"
    found: list[RolloutProgress] = []
    query = "WorkflowType = 'RolloutWorkflow' AND ExecutionStatus = 'Running'"
    async for execution in client.list_workflows(query):
        if not execution.id.startswith(prefix):
            continue  # another cluster's, in a shared namespace
        memo = (await execution.memo()).get("rollout") or {}
        found.append(RolloutProgress(id=execution.id, **{k: v for k, v in memo.items() if v is not None}))
    return sorted(found, key=lambda rollout: rollout.id)
