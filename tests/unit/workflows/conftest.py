"""Workflow unit tests: the time-skipping Temporal server, karpflow's workflows, fake activities."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest_asyncio
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from runtime.connections import ensure_search_attributes, with_karpflow_converter
from tests.unit.workflows.fakes import FakeCluster
from worker import WORKFLOWS


@pytest_asyncio.fixture(scope="module")
async def ts_client(time_skipping_env: WorkflowEnvironment) -> Client:
    """A client with karpflow's data converter, search attributes registered."""
    client = with_karpflow_converter(time_skipping_env.client)
    assert await ensure_search_attributes(client)
    return client


class Harness:
    def __init__(self, client: Client, cluster: FakeCluster, task_queue: str) -> None:
        self.client = client
        self.cluster = cluster
        self.task_queue = task_queue

    def id(self, prefix: str) -> str:
        return f"{prefix}/{uuid.uuid4().hex[:8]}"


@pytest_asyncio.fixture
async def harness(ts_client: Client) -> AsyncIterator[Harness]:
    cluster = FakeCluster()
    task_queue = f"unit-{uuid.uuid4().hex[:8]}"
    async with Worker(
        ts_client, task_queue=task_queue, workflows=list(WORKFLOWS), activities=cluster.activities()
    ):
        yield Harness(ts_client, cluster, task_queue)
