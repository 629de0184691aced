"""Decision quality on the live local stack: Karpenter's rules and Optimal consolidation, one after
the other, on the same fragmented cluster, with the controller alone.

    python bench/bench_quality_live.py [--nodes 40] [--timeout 900] [--strategy both]

For each strategy a fresh dev stack (sim/devstack.py: Temporal dev server, the simulator with its
kubelets, kube-scheduler and workloads on moto, the worker with its controller) is started on the
same scenario: `--nodes` nodes of assorted types (m5, c5, r5) in two zones, each 20-40 % used by
Deployments with PDBs (maxUnavailable 1), two of them running a do-not-disrupt pod. Evicted pods are
placed by the simulated kube-scheduler (its default profile: sim/controllers/scheduler.py), not where
the planner's simulation put them; the stack has no provisioner, so a pod that fits nowhere stays
Pending (the invariant checker's `pods-lost` after five simulated minutes). The NodePool
carries `karpflow.dev/consolidation-strategy: Optimal` for the Optimal run. The controller runs with
a 1 s interval and a 2 s validation wait (Karpenter's 10 s and 15 s would only make the run longer)
until its status is quiet; then printed: end cost (every node at its own offering) against the
fluid optimum of the pods' requests (bench_quality.py's yardstick, computed on the start), the time
to quiet, the DisruptionWorkflows and the nodes they disrupted, and the pods evicted (the
simulator's invariant checker counts every admitted eviction). CPU-heavy: run it alone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import os
import random
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_quality import fluid_optimum_of, pod_shape_bound

from api import search_attributes as sa
from api.constants import CAPACITY_TYPE_LABEL, INSTANCE_TYPE_LABEL, ZONE_LABEL
from api.controller_io import ControllerStatus
from api.quantity import millicores, to_int
from api.workflow_ids import controller_workflow_id
from planner.catalog import bundled_catalog
from planner.snapshot import Snapshot
from sim.cli import SimClient, dump_as_list
from sim.devstack import DevSettings, DevStack
from sim.ports import free_port
from sim.scenarios import generate_demo as gen

TYPES = ["m5.xlarge", "m5.2xlarge", "c5.xlarge", "c5.2xlarge", "r5.large", "r5.xlarge"]
SHAPES = [("250m", "512Mi"), ("500m", "1Gi"), ("1", "2Gi"), ("250m", "2Gi")]
ZONES = ["us-west-2a", "us-west-2b"]


def scenario(nodes: int, seed: int, strategy: str) -> dict:
    rng = random.Random(seed)
    catalog = bundled_catalog("us-west-2")
    demo_nodes, workloads = [], []
    for i in range(nodes):
        kind = rng.choice(TYPES)
        node = gen.DemoNode(
            f"172.31.{1 + i // 200}.{10 + i % 200}",
            kind,
            ZONES[i % 2],
            "on-demand",
            "default",
            timedelta(days=3),
            "fragment",
        )
        demo_nodes.append(node)
        alloc = catalog.get(kind).allocatable_resources
        target = rng.uniform(0.2, 0.4)
        suffix = node.ip.rsplit(".", 1)[-1] if i < 200 else node.ip.split(".", 2)[-1]
        cpu, memory = SHAPES[i % len(SHAPES)]
        per_pod = max(millicores(cpu) / alloc.cpu, to_int(memory) / alloc.memory)
        replicas = max(1, round(target / per_pod))
        annotations = {"karpenter.sh/do-not-disrupt": "true"} if i in (3, 17) else {}
        workloads.append(
            gen.Workload(
                "shop",
                f"svc-{i}",
                cpu,
                memory,
                [suffix] * replicas,
                pdb={"maxUnavailable": 1},
                annotations=annotations,
            )
        )
    listing = copy.deepcopy(gen.scenario_list(demo_nodes, workloads))
    for item in listing["items"]:
        if item["kind"] == "NodePool":
            item["spec"]["disruption"]["consolidateAfter"] = "0s"
            item["spec"]["disruption"]["budgets"] = [{"nodes": "20%"}]
            if strategy == "Optimal":
                item["metadata"].setdefault("annotations", {})["karpflow.dev/consolidation-strategy"] = (
                    "Optimal"
                )
    return listing


def end_fleet(settings: DevSettings) -> str:
    """The nodes at the end, grouped: count x type capacity type."""
    state = dump_as_list(SimClient(settings.kube_url).request("GET", "/sim/state"))
    kinds: dict[str, int] = {}
    for obj in state["items"]:
        if obj.get("kind") == "Node":
            labels = obj["metadata"].get("labels") or {}
            key = f"{labels.get(INSTANCE_TYPE_LABEL)} {labels.get(CAPACITY_TYPE_LABEL, 'on-demand')}"
            kinds[key] = kinds.get(key, 0) + 1
    return ", ".join(f"{n} x {k}" for k, n in sorted(kinds.items()))


def hourly_cost(settings: DevSettings) -> tuple[float, int]:
    """What the cluster's nodes cost per hour: each at its own offering (type, zone, capacity type:
    replacements may be spot), bundled prices."""
    catalog = bundled_catalog(settings.region)
    state = dump_as_list(SimClient(settings.kube_url).request("GET", "/sim/state"))
    total, count = 0.0, 0
    for obj in state["items"]:
        if obj.get("kind") != "Node":
            continue
        labels = obj["metadata"].get("labels") or {}
        kind = catalog.get(labels.get(INSTANCE_TYPE_LABEL))
        zone, capacity_type = labels.get(ZONE_LABEL, ""), labels.get(CAPACITY_TYPE_LABEL, "on-demand")
        total += (kind.price(zone, capacity_type) or 0.0) if kind else 0.0
        count += 1
    return total, count


async def watch(
    settings: DevSettings, within: float
) -> tuple[float | None, ControllerStatus, list[tuple[str, int]]]:
    from temporalio.client import Client
    from temporalio.contrib.pydantic import pydantic_data_converter

    client = await Client.connect(settings.temporal_address, data_converter=pydantic_data_converter)
    handle = client.get_workflow_handle(controller_workflow_id(settings.cluster_name))
    began = time.monotonic()
    status = ControllerStatus()
    quiet_at = None
    while time.monotonic() - began < within:
        try:
            status = await handle.query("status", result_type=ControllerStatus)
        except Exception:
            status = ControllerStatus()
        if status.passes > 1 and status.quiet:
            quiet_at = time.monotonic() - began
            break
        await asyncio.sleep(1.0)
    runs = []
    async for execution in client.list_workflows("WorkflowType = 'DisruptionWorkflow'"):
        runs.append((execution.id, len(execution.typed_search_attributes.get(sa.NODES) or ())))
    with contextlib.suppress(Exception):
        await handle.terminate("bench over")
    return quiet_at, status, runs


def run(nodes: int, seed: int, strategy: str, timeout: float) -> dict:
    listing = scenario(nodes, seed, strategy)
    state = Path(tempfile.mkdtemp(prefix=f"karpflow-live-{strategy.lower()}-"))
    path = state / "scenario.yaml"
    path.write_text(yaml.safe_dump(listing))
    catalog = bundled_catalog("us-west-2")
    start_snapshot = Snapshot.from_objects(listing["items"])
    fluid = fluid_optimum_of(start_snapshot, catalog)
    # Nodes whose pods may never move (do-not-disrupt) stay at their own price in any fleet.
    pinned = {
        p.node_name
        for p in start_snapshot.pods
        if p.node_name and p.annotations.get("karpenter.sh/do-not-disrupt") == "true"
    }
    shape = pod_shape_bound(start_snapshot, catalog, pinned)
    host = "127.0.0.1"
    settings = DevSettings(
        state_dir=state / "stack",
        temporal_port=free_port(host),
        ui_port=free_port(host),
        kube_port=free_port(host),
        moto_port=free_port(host),
        scenario=path,
        time_scale=0.05,
        ui=False,
    )
    os.environ.update({"KARPFLOW_CONTROLLER_INTERVAL": "1", "KARPFLOW_CONTROLLER_VALIDATION": "2"})
    stack = DevStack(settings)
    try:
        stack.up()
        start_cost, start_nodes = hourly_cost(settings)
        quiet_at, status, runs = asyncio.run(watch(settings, timeout))
        end_cost, end_nodes = hourly_cost(settings)
        fleet = end_fleet(settings)
        observed = SimClient(settings.kube_url).request("GET", "/sim/invariants").get("observed", {})
        report = SimClient(settings.kube_url).request("GET", "/sim/invariants")
    finally:
        stack.down(purge=True)
    return {
        "strategy": strategy,
        "start": (start_cost, start_nodes),
        "end": (end_cost, end_nodes),
        "fluid": fluid,
        "shape": shape,
        "fleet": fleet,
        "quiet_at": quiet_at,
        "passes": status.passes,
        "commands": len(runs),
        "disrupted": sum(n for _, n in runs),
        "evicted": observed.get("evictions", 0),
        "violations": len(report.get("violations") or ()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for quiet per strategy")
    parser.add_argument("--strategy", choices=["karpenter", "optimal", "both"], default="both")
    args = parser.parse_args()
    strategies = ["Karpenter", "Optimal"] if args.strategy == "both" else [args.strategy.capitalize()]
    for strategy in strategies:
        r = run(args.nodes, args.seed, strategy, args.timeout)
        start_cost, start_nodes = r["start"]
        end_cost, end_nodes = r["end"]
        quiet = (
            f"{r['quiet_at']:.0f} s" if r["quiet_at"] is not None else f"not quiet after {args.timeout:.0f} s"
        )
        print(
            f"{strategy:9s} seed {args.seed}: ${start_cost:.3f}/h on {start_nodes} nodes -> "
            f"${end_cost:.3f}/h on {end_nodes} nodes, {end_cost / r['fluid'] - 1:+.1%} vs fluid optimum "
            f"${r['fluid']:.3f}/h, {end_cost / r['shape'] - 1:+.1%} vs pod-shape bound ${r['shape']:.3f}/h "
            f"(do-not-disrupt nodes at their price); quiet after {quiet} ({r['passes']} passes); "
            f"{r['commands']} disruptions ({r['disrupted']} nodes); "
            f"{r['evicted']} pods evicted; {r['violations']} invariant violations; end fleet {r['fleet']}",
            flush=True,
        )


if __name__ == "__main__":
    main()
