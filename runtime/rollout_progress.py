"""The running rollouts of a cluster and their progress, from Temporal visibility and each one's memo
(`karpflow status` lists them; `karpflow rollout --status ID` asks one for its full status)."""

from __future__ import annotations

from temporalio.client import Client


async def running_rollouts(client: Client, cluster: str) -> list[str]:
    """One line per running RolloutWorkflow of `cluster`: id, phase, replaced of total, remaining."""
    prefix = f"rollout/{cluster}/"
    lines: list[str] = []
    query = "WorkflowType = 'RolloutWorkflow' AND ExecutionStatus = 'Running'"
    async for execution in client.list_workflows(query):
        if not execution.id.startswith(prefix):
            continue  # another cluster's, in a shared namespace
        progress = (await execution.memo()).get("rollout") or {}
        lines.append(
            f"{execution.id}: {progress.get('phase', 'Marking')}, {progress.get('replaced', 0)}/"
            f"{progress.get('total', 0)} replaced, {progress.get('remaining', 0)} remaining"
        )
    return sorted(lines)
