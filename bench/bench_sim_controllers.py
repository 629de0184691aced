"""How fast the simulated cluster's controllers are (prints figures; not a pass/fail test).

1. Node lifecycle: 1,000 instances launched in moto (over HTTP, 100 per RunInstances call) become
   1,000 Ready nodes at time scale 0 — how long from the end of the launches, and what one poll of
   the whole cluster costs — once reading moto in process (`ec2_source="moto"`) and once through
   the EC2 API over HTTP (`ec2_source="api"`).
2. Scheduler: N pending pods created straight in the store against M Ready nodes, then the
   controllers start; bind rate in pods/s (the informer's initial list included), with only the
   scheduler and then with the kubelet starting every pod too.

    .venv/bin/python bench/bench_sim_controllers.py [--instances 1000] [--pods 10000] [--nodes 500]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import boto3
from moto.server import ThreadedMotoServer

from api.constants import cluster_tag
from planner.catalog import bundled_catalog
from sim.apiserver.store import Store
from sim.controllers.node_objects import ready_condition
from sim.controllers.runner import SimControllers
from sim.timescale import TimeScale

REGION = "us-west-2"
ZERO = TimeScale(0.0)


def count_ready(store: Store) -> tuple[int, int]:
    nodes = store.list("nodes").items
    ready = sum(
        1
        for n in nodes
        if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
    )
    return len(nodes), ready


async def bench_nodes(endpoint: str, instances: int, source: str) -> None:
    """Launch every instance first, then start the controllers: the figure is theirs alone."""
    ec2 = boto3.client(
        "ec2", region_name=REGION, endpoint_url=endpoint, aws_access_key_id="x", aws_secret_access_key="x"
    )
    cluster = f"bench-{source}"
    tags = [{"ResourceType": "instance", "Tags": [{"Key": cluster_tag(cluster), "Value": "owned"}]}]
    started = time.monotonic()
    for start in range(0, instances, 100):
        batch = min(100, instances - start)
        await asyncio.to_thread(
            ec2.run_instances,
            ImageId="ami-12345678",
            MinCount=batch,
            MaxCount=batch,
            InstanceType="m5.large",
            TagSpecifications=tags,
        )
    launched = time.monotonic()
    store = Store(ZERO)
    controllers = SimControllers(
        store,
        ec2_endpoint=endpoint,
        cluster_name=cluster,
        region=REGION,
        timescale=ZERO,
        enabled=["nodes", "kubelet", "scheduler", "podgc"],
        ec2_source=source,
    )
    try:
        await controllers.start()
        nodes = controllers.controllers["nodes"]
        await until(lambda: nodes.summary().get("ready", 0) >= instances)
        done = time.monotonic()
        assert count_ready(store) == (instances, instances)
        await until(lambda: nodes.polls >= 3, limit=120)  # a steady-state poll, not the first one
        print(f"node lifecycle, time scale 0, {instances} m5.large instances, ec2_source={source!r}:")
        print(f"  (launching them in moto, 100 per call:   {launched - started:6.2f} s)")
        print(
            f"  controllers started -> all nodes Ready:  {done - launched:6.2f} s"
            f" -> {instances / (done - launched):,.0f} nodes/s"
        )
        poll = nodes.last_poll_seconds
        print(f"  one poll of the {instances} instances:        {poll:6.2f} s")
    finally:
        await controllers.stop()


async def until(done, limit: float = 600.0) -> None:
    """Poll `done()` every 50 ms (the counters live in the controllers; there is nothing to await)."""
    deadline = time.monotonic() + limit
    while not done() and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)


def ready_node(name: str, itype) -> dict:
    at = "2026-01-01T00:00:00Z"
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **itype.labels}},
        "spec": {},
        "status": {
            "capacity": itype.capacity,
            "allocatable": itype.allocatable,
            "conditions": [ready_condition("True", "KubeletReady", "ready", at)],
        },
    }


def pending_pod(i: int) -> dict:
    return {
        "metadata": {"name": f"p-{i:06d}", "namespace": "default", "labels": {"app": f"app-{i % 20}"}},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "x",
                    "resources": {
                        "requests": {"cpu": f"{100 + (i % 5) * 50}m", "memory": f"{128 + (i % 4) * 64}Mi"}
                    },
                }
            ]
        },
    }


async def bench_scheduler(pods: int, nodes: int, with_kubelet: bool) -> None:
    """Create the nodes and pending pods first, then start the controllers and time the binding."""
    store = Store(ZERO)
    itype = bundled_catalog(REGION).get("m5.2xlarge")
    assert itype is not None
    for i in range(nodes):
        store.create("nodes", ready_node(f"node-{i:04d}", itype), keep_status=True)
    for i in range(pods):
        store.create("pods", pending_pod(i))
    enabled = ["scheduler", "kubelet"] if with_kubelet else ["scheduler"]
    controllers = SimControllers(store, timescale=ZERO, enabled=enabled, pod_start_seconds=0)
    started = time.monotonic()
    await controllers.start()
    scheduler = controllers.controllers["scheduler"]
    try:
        await until(lambda: scheduler.bound >= pods)
        bound = time.monotonic()
        if with_kubelet:
            kubelet = controllers.controllers["kubelet"]
            await until(lambda: kubelet.started >= pods)
        end = time.monotonic()
        label = "scheduler + kubelet" if with_kubelet else "scheduler only"
        print(f"scheduler ({label}), {pods} pending pods, {nodes} Ready m5.2xlarge nodes, 20 pod shapes:")
        print(
            f"  all bound after:                         {bound - started:6.2f} s "
            f"-> {scheduler.bound / (bound - started):,.0f} pods/s"
        )
        if with_kubelet:
            print(
                f"  all Running after:                       {end - started:6.2f} s "
                f"-> {pods / (end - started):,.0f} pods/s"
            )
    finally:
        await controllers.stop()


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--instances", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--nodes", type=int, default=500)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    endpoint = f"http://127.0.0.1:{moto._server.server_port}"  # type: ignore[union-attr]
    try:
        for source in ("moto", "api"):
            await bench_nodes(endpoint, args.instances, source)
    finally:
        moto.stop()
    await bench_scheduler(args.pods, args.nodes, with_kubelet=False)
    await bench_scheduler(args.pods, args.nodes, with_kubelet=True)


if __name__ == "__main__":
    asyncio.run(main())
