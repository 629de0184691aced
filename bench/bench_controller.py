"""What one controller pass costs: Kubernetes API requests, time and memory, on large clusters.

    python bench/bench_controller.py                  # 1,000 nodes / 20,000 pods
    python bench/bench_controller.py --sizes 5000x100000

For each size a cluster is generated (sim.cluster_builder.generate_cluster) and loaded into the
Kubernetes emulator (in process, no controllers, so nothing changes under the measurement). The
worker's informer cache (cluster/informer.py) lists and starts watching, then the bench runs the
controller's planning step three times as `plan_pass` does (cache → snapshot → planner) and reads
the emulator's request log: how many requests each pass made, and how many objects they listed.
A pass must not list all pods: after the first sync it should make none at all. Also printed: the
sync time, the pass time (CPU and wall: the machine is shared), and the process's peak RSS.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cluster.informer import ClusterCache
from kube.client import KubeApi
from planner.catalog import bundled_catalog
from planner.plan import plan
from planner.snapshot import Snapshot
from sim.cluster_builder import ClusterSpec, generate_cluster
from sim.scenario import parse_scenario
from sim.stack import SimStack


def with_images(listing: dict) -> dict:
    """The generator writes what the planner reads; the emulator also wants what a real API server
    requires (a container image)."""
    for item in listing["items"]:
        spec = item.get("spec") or {}
        pod_spec = (spec.get("template") or {}).get("spec") if item["kind"] != "Pod" else spec
        for container in (pod_spec or {}).get("containers") or ():
            container.setdefault("image", "registry.k8s.io/pause:3.10")
    return listing


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def measure(stack: SimStack, passes: int) -> dict[str, object]:
    kube = KubeApi.for_host(stack.kube_url, user_agent="karpflow-bench")
    cache = ClusterCache(kube)
    began = time.perf_counter()
    before_sync = len(stack.requests.query())
    cache.start()
    assert await cache.wait_synced(600), cache.unsynced()
    sync_seconds = time.perf_counter() - began
    sync_requests = len(stack.requests.query()) - before_sync
    catalog = bundled_catalog("us-west-2")
    rows = []
    for _ in range(passes):
        mark = stack.requests.query()[-1].seq if stack.requests.query() else 0
        wall, cpu = time.perf_counter(), time.process_time()
        snapshot = await asyncio.to_thread(Snapshot.from_objects, list(cache.objects()), datetime.now(UTC))
        result = await asyncio.to_thread(plan, snapshot, catalog)
        requests = stack.requests.query(since_seq=mark)
        rows.append(
            {
                "wall_s": round(time.perf_counter() - wall, 2),
                "cpu_s": round(time.process_time() - cpu, 2),
                "requests": len(requests),
                "pod_lists": sum(1 for r in requests if r.verb == "list" and r.resource == "pods"),
                "commands": len(result.commands),
            }
        )
    await cache.stop()
    await kube.close()
    return {"sync_s": round(sync_seconds, 1), "sync_requests": sync_requests, "passes": rows}


@click.command()
@click.option("--sizes", default="1000x20000", show_default=True, help="NODESxPODS[,NODESxPODS...]")
@click.option("--passes", default=3, show_default=True)
def main(sizes: str, passes: int) -> None:
    for size in sizes.split(","):
        nodes, pods = (int(x) for x in size.split("x"))
        t0 = time.perf_counter()
        listing = with_images(
            generate_cluster(ClusterSpec(nodes=nodes, pods=pods, pools=4, seed=1)).as_list()
        )
        scenario = parse_scenario(json.dumps(listing), f"generated {size}")
        stack = SimStack(scenario=scenario, controllers=False).start(timeout=900)
        load = time.perf_counter() - t0
        try:
            figures = asyncio.run(measure(stack, passes))
        finally:
            stack.stop()
        print(f"== {nodes} nodes / {pods} pods (generated and loaded in {load:.0f}s)")
        print(
            f"   informer sync: {figures['sync_s']}s, {figures['sync_requests']} requests "
            "(a list and a watch per kind)"
        )
        for index, row in enumerate(figures["passes"], 1):  # type: ignore[arg-type]
            print(
                f"   pass {index}: {row['requests']} API requests ({row['pod_lists']} pod lists), "
                f"{row['wall_s']}s wall / {row['cpu_s']}s CPU, {row['commands']} command(s)"
            )
        print(f"   peak RSS of the process: {peak_mb():.0f} MB")


if __name__ == "__main__":
    main()
