"""`--otel-exporter otlp`: Temporal's tracing interceptor exports workflow and activity spans over
OTLP/HTTP. A small collector on loopback receives them; the workflow runs on the time-skipping
server with the fake activities."""

from __future__ import annotations

import asyncio
import uuid

import pytest_asyncio
from aiohttp import web
from opentelemetry import trace
from temporalio.client import Client
from temporalio.worker import Worker

from api.workflow_io import TerminationInput
from runtime.settings import WorkerSettings
from runtime.telemetry import tracing_interceptors
from tests.unit.workflows.fakes import FakeCluster
from worker import WORKFLOWS
from workflows.termination import TerminationWorkflow


@pytest_asyncio.fixture
async def collector():
    """An OTLP/HTTP traces endpoint that keeps every request body."""
    bodies: list[bytes] = []

    async def traces(request: web.Request) -> web.Response:
        bodies.append(await request.read())
        return web.Response(status=200, content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}/v1/traces", bodies
    await runner.cleanup()


async def test_workflow_and_activity_spans_reach_an_otlp_collector(ts_client: Client, collector):
    endpoint, bodies = collector
    settings = WorkerSettings(cluster_name="test", otel_exporter="otlp", otel_endpoint=endpoint)
    interceptors = tracing_interceptors(settings)
    config = ts_client.config()
    config["interceptors"] = interceptors
    client = Client(**config)
    cluster = FakeCluster()
    node = f"node-{uuid.uuid4().hex[:8]}"
    cluster.nodes.add(node)
    task_queue = f"otlp-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client, task_queue=task_queue, workflows=list(WORKFLOWS), activities=cluster.activities()
    ):
        await client.execute_workflow(
            TerminationWorkflow.run,
            TerminationInput(node=node),
            id=f"termination/{node}",
            task_queue=task_queue,
        )
    # In a thread: the exporter posts synchronously to the collector, which runs on this loop.
    await asyncio.to_thread(trace.get_tracer_provider().force_flush)  # type: ignore[attr-defined]

    exported = b"".join(bodies)
    for span in (
        b"StartWorkflow:TerminationWorkflow",
        b"RunWorkflow:TerminationWorkflow",
        b"RunActivity:drain_node",
    ):
        assert span in exported, span
    assert b"karpflow-worker" in exported  # the service name of the resource
