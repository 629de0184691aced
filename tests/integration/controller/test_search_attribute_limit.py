"""A command of many nodes stays startable: Temporal refuses a search attribute value over 2 KB.

Found by the soak bench (bench/bench_soak.py, 500 nodes): an emptiness command of about 130 nodes gave
`KarpflowNodes` 5.7 KB; the controller's child start failed its workflow task ("search attribute
KarpflowNodes value size 5665 exceeds size limit 2048"), the server terminated the controller, and
every restart planned the same command again: no pass ever completed.
"""

from __future__ import annotations

import uuid

import pytest
from temporalio.client import WorkflowExecutionStatus

from api import search_attributes as sa
from api.workflow_io import DisruptionInput
from runtime.connections import ensure_search_attributes, with_karpflow_converter

pytestmark = pytest.mark.integration

NODES = [f"ip-172-31-{i // 250}-{i % 250}.us-west-2.compute.internal" for i in range(130)]


async def test_a_command_of_130_nodes_starts_searchable_by_the_nodes_that_fit(dev_server_env):
    client = with_karpflow_converter(dev_server_env.client)
    await ensure_search_attributes(client)
    workflow_id = f"disruption/limit/{uuid.uuid4().hex[:8]}"
    # No worker polls this queue: only the start and what visibility keeps of it are tested.
    handle = await client.start_workflow(
        "DisruptionWorkflow",
        DisruptionInput(reason="Empty", nodes=NODES),
        id=workflow_id,
        task_queue=f"unpolled-{uuid.uuid4().hex[:8]}",
        search_attributes=sa.at_start(NODES, "Empty", "default"),
    )
    try:
        described = await handle.describe()
        assert described.status == WorkflowExecutionStatus.RUNNING
        listed = described.typed_search_attributes.get(sa.NODES) or []
        assert 0 < len(listed) < len(NODES) and listed == NODES[: len(listed)]
    finally:
        await handle.terminate("test over")
