"""The in-flight source for the disrupted-taint rule, read from open workflows on the real dev server."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import pytest
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from api import search_attributes as sa
from sim.invariants import nodes_in_flight

pytestmark = pytest.mark.integration


async def test_nodes_of_open_workflows_are_in_flight(dev_server_env):
    client = dev_server_env.client
    with contextlib.suppress(Exception):  # already registered by another test: fine
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(
                namespace=client.namespace,
                search_attributes={sa.NODES.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD_LIST},
            )
        )
    queue = f"in-flight-{uuid.uuid4().hex[:8]}"
    # No worker polls this queue: the workflow simply stays open, as a disruption in progress would.
    handle = await client.start_workflow(
        "DisruptionWorkflow",
        id=f"disruption/test/{queue}",
        task_queue=queue,
        search_attributes=TypedSearchAttributes([SearchAttributePair(sa.NODES, ["node-a", "node-b"])]),
    )
    query = f"TaskQueue = '{queue}' AND ExecutionStatus = 'Running'"
    try:
        deadline = time.monotonic() + 10
        while (found := await nodes_in_flight(client, query)) != {"node-a", "node-b"}:
            assert time.monotonic() < deadline, f"visibility never listed the workflow (got {found})"
            await asyncio.sleep(0.1)
    finally:
        await handle.terminate("test over")
    deadline = time.monotonic() + 10
    while await nodes_in_flight(client, query):
        assert time.monotonic() < deadline, "a closed workflow still counted as in flight"
        await asyncio.sleep(0.1)
