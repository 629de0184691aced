"""Interruption handling at burst: prints figures, asserts nothing.

Runs the real pieces: the Temporal dev server, the simulator process (emulator + moto with SQS and
EventBridge, simulated delays 0) and karpflow's worker with its interruption poller. N spot nodes
(default 100) receive 500 spot interruption warnings sent to the queue at once (5 per node: SQS
delivers at least once, and AWS may repeat a warning). Measures the time until every message is
handled (deleted), the time until every interruption workflow has closed, and checks that none is
lost: 500 deleted, exactly one `interruption/<cluster>/<instance-id>/spot` run per node, and the
replacements the scheduling simulation asks for (pods that fit on the other nodes need none).
The burst is sent once the worker is up (its cache listed, its poller polling). "Event → workflow
started" is read from Temporal: each interruption workflow's start time minus the moment its node's
first warning was sent (the same measure whatever the poller counts itself).
Ends with the figures against issue 21's goals (p50 < 2 s, max < 10 s).

    .venv/bin/python bench/bench_interruption.py [--nodes 100] [--messages 500]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import boto3
from botocore.config import Config
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from api.workflow_ids import interruption_workflow_id
from bench.bench_workflows import Simulator, build, demo_node, free_port
from bench.goals import Goal, print_goals
from cluster.informer import ClusterCache
from cluster.interruption import InterruptionPoller, instance_id_of
from kube.client import KubeApi
from runtime.connections import ensure_search_attributes, with_karpflow_converter
from runtime.settings import WorkerSettings
from sim.binaries import temporal_cli
from sim.interruption_queue import MOTO_KEYS, ensure_interruption_queue
from worker import KarpflowWorker


def body(instance_id: str, n: int) -> str:
    return json.dumps(
        {
            "version": "0",
            "id": f"bench-{instance_id}-{n}",
            "detail-type": "EC2 Spot Instance Interruption Warning",
            "source": "aws.ec2",
            "account": "123456789012",
            "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "region": "us-west-2",
            "resources": [],
            "detail": {"instance-id": instance_id, "instance-action": "terminate"},
        }
    )


async def until_listening(port: int, within: float = 60.0) -> None:
    """Until the server on `port` accepts connections (a loaded machine starts it slowly)."""
    deadline = time.monotonic() + within
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
            continue
        writer.close()
        return


async def closed_status(handle: WorkflowHandle) -> tuple[WorkflowExecutionStatus, int, datetime]:
    """How the run ended, how many replacements it launched, and when it started."""
    launched = 0
    with contextlib.suppress(Exception):  # the status says how it ended
        result = await handle.result()
        launched = sum(1 for r in result.get("replacements", []) if r.get("instance_id"))
    described = await handle.describe()
    return described.status, launched, described.start_time


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--messages", type=int, default=500)
    parser.add_argument(
        "--sqs-apart",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="SQS on its own moto server (default), not the simulator's busy EC2 moto",
    )
    args = parser.parse_args()
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(key, "testing")
    logging.basicConfig(level=logging.WARNING)

    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli(),
        ui=False,
        dev_server_extra_args=["--dynamic-config-value", "frontend.enableServerVersionCheck=false"],
    )
    sim = Simulator(f"bench-{uuid.uuid4().hex[:6]}")
    sqs_server: subprocess.Popen[bytes] | None = None
    try:
        client = with_karpflow_converter(env.client)
        await ensure_search_attributes(client)
        await asyncio.to_thread(sim.start)
        victims = [demo_node(f"172.31.{1 + i // 200}.{1 + i % 200}", "m5.large") for i in range(args.nodes)]
        victims = [replace(v, capacity_type="spot") for v in victims]
        await asyncio.to_thread(sim.load, build(victims, []))
        kube = KubeApi.for_host(sim.kube_url, user_agent="bench")
        instances = [i for n in (await kube.list_nodes())["items"] if (i := instance_id_of(n))]
        sqs_endpoint = sim.ec2_endpoint
        if args.sqs_apart:  # SQS on a moto of its own: in AWS it is not the busy EC2 endpoint either
            port = free_port()
            sqs_server = subprocess.Popen(  # noqa: ASYNC220 - a server that outlives this call
                [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            sqs_endpoint = f"http://127.0.0.1:{port}"
            await until_listening(port)
        url = ensure_interruption_queue(sqs_endpoint, sim.region, "bench-interruption")
        sqs = boto3.client(
            "sqs",
            endpoint_url=sqs_endpoint,
            region_name=sim.region,
            config=Config(max_pool_connections=64),
            **MOTO_KEYS,
        )
        ec2 = boto3.client("ec2", endpoint_url=sim.ec2_endpoint, region_name=sim.region, **MOTO_KEYS)
        before = sum(len(r["Instances"]) for r in ec2.describe_instances()["Reservations"])
        sent_at: dict[str, datetime] = {}  # instance → when its first warning was sent

        def send_burst() -> None:
            bodies = [body(instances[i % len(instances)], i) for i in range(args.messages)]  # time: now
            for start in range(0, len(bodies), 10):
                now = datetime.now(UTC)
                for i in range(start, min(start + 10, len(bodies))):
                    sent_at.setdefault(instances[i % len(instances)], now)
                entries = [{"Id": str(j), "MessageBody": b} for j, b in enumerate(bodies[start : start + 10])]
                sqs.send_message_batch(QueueUrl=url, Entries=entries)

        settings = WorkerSettings(
            cluster_name=sim.cluster_name,
            task_queue=f"bench-{uuid.uuid4().hex[:6]}",
            temporal_address=env.client.service_client.config.target_host,
            kube_api_server=sim.kube_url,
            # what a replacement bootstraps against (the simulator boots nodes only from it)
            cluster_endpoint=sim.kube_url,
            cluster_ca_bundle=sim.ca_bundle,
            service_cidr=sim.service_cidr,
            aws_endpoint_url=sim.ec2_endpoint,
            aws_region=sim.region,
            poll_interval=0.1,
            ec2_poll_interval=0.1,
            health=False,
            register_search_attributes=False,
            node_watcher=False,
            log_level="WARNING",
        )
        async with KarpflowWorker(settings, client=client):
            # The worker's own poller class, on the SQS endpoint chosen above, with an informer cache
            # as the worker gives it (replacements come from the scheduling simulation on it).
            cache = ClusterCache(kube)
            cache.start()
            poller = InterruptionPoller(
                sqs, url, kube, client, settings.task_queue, sim.cluster_name, wait_seconds=1, cache=cache
            )
            polling = asyncio.create_task(poller.run())
            # The burst reaches a worker that is up, its cache listed and its poller polling.
            assert await cache.wait_synced(60)
            await asyncio.sleep(2)
            started = time.perf_counter()
            await asyncio.to_thread(send_burst)
            while poller.counters["deleted"] + poller.counters["failed"] < args.messages:
                await asyncio.sleep(0.05)
                if time.perf_counter() - started > 600:
                    break
            handled = time.perf_counter() - started
            handles = [
                client.get_workflow_handle(
                    interruption_workflow_id(sim.cluster_name, i, "spot"), result_type=dict
                )
                for i in instances
            ]
            statuses = []
            for handle in handles:
                statuses.append(await closed_status(handle))
            closed = time.perf_counter() - started
            counters = dict(poller.counters)
            latencies = sorted(poller.latencies)
            polling.cancel()
            await cache.stop()
        runs = 0
        for i in instances:
            runs += len(
                [
                    e
                    async for e in client.list_workflows(
                        f'WorkflowId="{interruption_workflow_id(sim.cluster_name, i, "spot")}"'
                    )
                ]
            )
        after = sum(len(r["Instances"]) for r in ec2.describe_instances()["Reservations"])
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
        left = int(attributes["Attributes"]["ApproximateNumberOfMessages"])
        await kube.close()
        completed = sum(s == WorkflowExecutionStatus.COMPLETED for s, _, _ in statuses)
        replacements = sum(n for _, n, _ in statuses)
        to_start = sorted(
            (start - sent_at[i]).total_seconds() for i, (_, _, start) in zip(instances, statuses, strict=True)
        )
        p50, worst = statistics.median(to_start), to_start[-1]
        print(f"interruption burst: {args.messages} spot warnings for {len(instances)} nodes, sent at once")
        print(f"   all messages handled (deleted)   {handled:7.2f} s   ({args.messages / handled:.0f} msg/s)")
        print(
            f"   all workflows closed             {closed:7.2f} s   ({completed}/{len(instances)} completed)"
        )
        print(f"   counters                         {counters}")
        print(f"   event→workflow started           p50 {p50:.2f} s  max {worst:.2f} s  (Temporal's times)")
        if latencies:
            print(
                f"   as the poller counts it          p50 {statistics.median(latencies):.2f} s"
                f"  max {latencies[-1]:.2f} s  ({counters.get('acted', len(latencies))} messages acted on, "
                f"the latest {len(latencies)} measured)"
            )
        print(f"   interruption runs                {runs} (one per node: {runs == len(instances)})")
        print(f"   replacements launched            {replacements} (instances in moto: {before} → {after})")
        print(
            f"   messages left in the queue       {left}"
            f" (none lost: {left == 0 and counters['deleted'] >= args.messages})"
        )
        one_each = runs == len(instances)
        what = f"{args.messages} warnings, {len(instances)} nodes"
        print_goals(
            "interruption burst (bench_interruption.py)",
            [
                Goal(f"event → workflow started p50 ({what})", "< 2 s", f"{p50:.2f} s", p50 < 2),
                Goal(f"event → workflow started max ({what})", "< 10 s", f"{worst:.2f} s", worst < 10),
                Goal("messages handled per second", "", f"{args.messages / handled:.0f}"),
                Goal("one interruption run per node", "yes", str(one_each), one_each),
            ],
        )
    finally:
        if sqs_server is not None:
            sqs_server.terminate()
        sim.stop()
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
