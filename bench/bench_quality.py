"""Decision quality of consolidation: how close to the cheapest possible cluster do plans get?

Start from a fragmented cluster (nodes of assorted sizes, each 15-45 % used by small Deployments),
then repeat: plan a pass (emptiness, drift, multi- and single-node consolidation, Karpenter's order;
the first method with commands ends the pass), apply it, advance the clock a minute. Stop when a pass
plans nothing. Applying a command = remove its nodes, launch its replacement as the cheapest option
(cheapest zone for its capacity type), and bind every moved pod where the scheduling simulation put
it (existing node or the new one).

Lower bound (documented, deliberately optimistic): the pods' total requests priced at the cheapest
$/vCPU and the cheapest $/GiB among the offerings the NodePool may launch, whichever is higher:
    bound = max(total_cpu x min(price / vCPU), total_memory x min(price / GiB))
Capacity (not allocatable) and no DaemonSet or kube-reserved overhead, so no real packing reaches it.

Run: .venv/bin/python bench/bench_quality.py [--nodes 200] [--seed 7] [--scenario on-demand|spot]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from api.constants import CAPACITY_ON_DEMAND, CAPACITY_SPOT, CAPACITY_TYPE_LABEL
from planner.catalog import Catalog
from planner.model import Command, PlanOptions
from planner.plan import plan
from planner.scheduling_adapter import SnapshotSimulation
from planner.testing import ClusterBuilder

GIB = 1 << 30
NODE_TYPES = [
    "m5.large",
    "m5.xlarge",
    "m5.2xlarge",
    "m5.4xlarge",
    "c5.xlarge",
    "c5.2xlarge",
    "r5.large",
    "r5.xlarge",
]
POD_SHAPES = [
    ("100m", "128Mi"),
    ("250m", "512Mi"),
    ("500m", "1Gi"),
    ("1", "2Gi"),
    ("2", "4Gi"),
    ("250m", "2Gi"),
]


def fragmented_cluster(nodes: int, seed: int, scenario: str) -> ClusterBuilder:
    rng = random.Random(seed)
    b = ClusterBuilder()
    catalog = b.catalog
    assert catalog is not None
    capacity_types = [CAPACITY_ON_DEMAND] if scenario == "on-demand" else [CAPACITY_SPOT, CAPACITY_ON_DEMAND]
    b.nodepool(
        "default",
        budgets=[{"nodes": "20%"}],
        expire_after="Never",
        requirements=[
            {"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": capacity_types},
            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
            {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["m5", "c5", "r5"]},
        ],
    )
    b.nodeclass()
    b.daemonset("kube-proxy", cpu="100m", memory="64Mi")
    zones = catalog.zones
    free: dict[str, list[int]] = {}
    for i in range(nodes):
        name = f"node-{i:04d}"
        itype = catalog.get(rng.choice(NODE_TYPES))
        assert itype is not None
        b.node(name, instance_type=itype.name, zone=zones[i % len(zones)], capacity_type=CAPACITY_ON_DEMAND)
        b.daemonset_pod(name, "kube-proxy", cpu="100m", memory="64Mi")
        alloc = itype.allocatable_resources
        target = rng.uniform(0.15, 0.45)
        free[name] = [int(alloc.cpu * target) - 100, int(alloc.memory * target) - (64 << 20), alloc.pods - 1]
    names = list(free)
    workload = 0
    for name in names:
        # Fill each node to its target with replicas of a few Deployments (shared signatures).
        while True:
            cpu, memory = POD_SHAPES[workload % len(POD_SHAPES)]
            from api.quantity import millicores, to_int

            need = (millicores(cpu), to_int(memory))
            room = free[name]
            if room[0] < need[0] or room[1] < need[1] or room[2] < 1:
                break
            room[0] -= need[0]
            room[1] -= need[1]
            room[2] -= 1
            app = f"app-{workload % 40}"
            b.pod(f"{app}-{name}-{room[2]}", name, cpu=cpu, memory=memory, app=app, namespace="shop")
            workload += 1
    return b


def lower_bound(builder: ClusterBuilder, scenario: str) -> tuple[float, float, float]:
    catalog = builder.catalog
    assert catalog is not None
    allowed = {CAPACITY_ON_DEMAND} if scenario == "on-demand" else {CAPACITY_ON_DEMAND, CAPACITY_SPOT}
    per_cpu = per_gib = float("inf")
    for it in catalog:
        if it.family not in ("m5", "c5", "r5"):
            continue
        prices = [o.price for o in it.offerings if o.available and o.capacity_type in allowed]
        if prices:
            per_cpu = min(per_cpu, min(prices) / (it.cpu / 1000))
            per_gib = min(per_gib, min(prices) / (it.memory / GIB))
    snapshot = builder.snapshot(via_yaml=False)
    cpu = sum(p.requests.cpu for p in snapshot.pods if not p.is_daemonset) / 1000
    mem = sum(p.requests.memory for p in snapshot.pods if not p.is_daemonset) / GIB
    return max(cpu * per_cpu, mem * per_gib), cpu, mem


def fluid_optimum(builder: ClusterBuilder, scenario: str) -> float:
    """A tighter reference: the cheapest mix of fractional nodes whose allocatable (minus the
    DaemonSet) covers the total cpu and memory. A 2-constraint LP, so some optimum uses at most two
    instance types: try every type alone and every pair."""
    catalog = builder.catalog
    assert catalog is not None
    allowed = {CAPACITY_ON_DEMAND} if scenario == "on-demand" else {CAPACITY_ON_DEMAND, CAPACITY_SPOT}
    snapshot = builder.snapshot(via_yaml=False)
    need_cpu = sum(p.requests.cpu for p in snapshot.pods if not p.is_daemonset)
    need_mem = sum(p.requests.memory for p in snapshot.pods if not p.is_daemonset)
    ds_cpu = sum(d.pod.requests.cpu for d in snapshot.daemonsets)
    ds_mem = sum(d.pod.requests.memory for d in snapshot.daemonsets)
    shapes = []
    for it in catalog:
        prices = [o.price for o in it.offerings if o.available and o.capacity_type in allowed]
        if it.family in ("m5", "c5", "r5") and prices:
            alloc = it.allocatable_resources
            shapes.append((min(prices), alloc.cpu - ds_cpu, alloc.memory - ds_mem))
    best = min(p * max(need_cpu / c, need_mem / m) for p, c, m in shapes)
    for pa, ca, ma in shapes:
        for pb, cb, mb in shapes:
            det = ca * mb - cb * ma
            if det == 0:
                continue
            xa = (need_cpu * mb - cb * need_mem) / det
            xb = (ca * need_mem - need_cpu * ma) / det
            if xa >= 0 and xb >= 0:
                best = min(best, pa * xa + pb * xb)
    return best


def cluster_cost(builder: ClusterBuilder) -> tuple[float, int]:
    snapshot = builder.snapshot(via_yaml=False)
    catalog = builder.catalog
    assert catalog is not None
    total = 0.0
    for node in snapshot.nodes.values():
        it = catalog.get(node.instance_type)
        price = it.price(node.zone or "", node.capacity_type or "") if it else None
        total += price or 0.0
    return total, len(snapshot.nodes)


def apply(builder: ClusterBuilder, command: Command, catalog: Catalog, counter: list[int]) -> None:
    """Remove the command's nodes, launch its replacement, bind moved pods where the simulation put them."""
    snapshot = builder.snapshot(via_yaml=False)
    placements: dict[str, str] = {}
    if command.method != "emptiness":
        result = SnapshotSimulation(snapshot, catalog).run(command.nodes)
        assert result.all_non_pending_scheduled, result.non_pending_errors()
        placements = dict(result.placements)
        for claim, replacement in zip(result.replacements, command.replacements, strict=True):
            best = replacement.instance_types[0]
            offers = [
                o
                for o in best.offerings
                if o.available
                and o.capacity_type == replacement.capacity_type
                and o.zone in replacement.zones
            ]
            zone = min(offers, key=lambda o: (o.price, o.zone)).zone
            counter[0] += 1
            name = f"new-{counter[0]:04d}"
            builder.node(
                name,
                instance_type=best.name,
                zone=zone,
                capacity_type=replacement.capacity_type,
                age=timedelta(0),
            )
            builder.daemonset_pod(name, "kube-proxy", cpu="100m", memory="64Mi")
            for key, target in placements.items():
                if target == claim.name:
                    placements[key] = name
    gone = set(command.nodes)
    kept = []
    for obj in builder.objects:
        kind = obj.get("kind")
        if kind == "Node" and obj["metadata"]["name"] in gone:
            continue
        if kind == "Pod":
            key = f"{obj['metadata'].get('namespace', 'default')}/{obj['metadata']['name']}"
            if key in placements:
                obj["spec"]["nodeName"] = placements[key]
            elif obj["spec"].get("nodeName") in gone:
                continue  # DaemonSet pods go with their node
        kept.append(obj)
    builder.objects[:] = kept


def describe_nodes(builder: ClusterBuilder) -> None:
    snapshot = builder.snapshot(via_yaml=False)
    for node in sorted(snapshot.nodes.values(), key=lambda n: n.name):
        used_cpu = sum(p.requests.cpu for p in node.pods if not p.is_terminal)
        used_mem = sum(p.requests.memory for p in node.pods if not p.is_terminal)
        print(
            f"    {node.name:10s} {node.instance_type:12s} {node.capacity_type:9s} "
            f"cpu {used_cpu / node.allocatable.cpu:5.0%}  memory {used_mem / node.allocatable.memory:5.0%}"
        )


def run(
    nodes: int, seed: int, scenario: str, max_passes: int, verbose: bool = False, spot_to_spot: bool = False
) -> None:
    builder = fragmented_cluster(nodes, seed, scenario)
    catalog = builder.catalog
    assert catalog is not None
    bound, cpu, mem = lower_bound(builder, scenario)
    start_cost, start_nodes = cluster_cost(builder)
    print(f"scenario {scenario}: {start_nodes} nodes, {cpu:.1f} vCPU, {mem:.1f} GiB requested")
    start_gap = start_cost / bound - 1
    print(f"  start        ${start_cost:8.3f}/h  {start_nodes:4d} nodes  {start_gap:+6.1%} vs bound")
    counter = [0]
    passes = commands = 0
    by_method: dict[str, int] = {}
    plan_seconds = 0.0
    for _ in range(max_passes):
        snapshot = builder.snapshot(via_yaml=False)
        started = time.perf_counter()
        result = plan(snapshot, catalog, PlanOptions(spot_to_spot=spot_to_spot))
        plan_seconds += time.perf_counter() - started
        chosen = [c for c in result.commands_ if c.method != "expiration"]
        if not chosen:
            break
        passes += 1
        for command in chosen:
            apply(builder, command, catalog, counter)
            commands += 1
            key = f"{command.method}/{command.decision}"
            by_method[key] = by_method.get(key, 0) + 1
        builder.now += timedelta(minutes=1)
    end_cost, end_nodes = cluster_cost(builder)
    print(f"  end          ${end_cost:8.3f}/h  {end_nodes:4d} nodes  {end_cost / bound - 1:+6.1%} vs bound")
    fluid = fluid_optimum(builder, scenario)
    print(f"  lower bound  ${bound:8.3f}/h")
    fluid_gap = end_cost / fluid - 1
    print(
        f"  fluid optimum ${fluid:7.3f}/h  (fractional nodes, allocatable - DaemonSets): end {fluid_gap:+.1%}"
    )
    methods = ", ".join(f"{k} {v}" for k, v in sorted(by_method.items()))
    print(f"  {passes} passes, {commands} commands ({methods}), planning {plan_seconds:.1f} s")
    if verbose:
        describe_nodes(builder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--scenario", choices=["on-demand", "spot", "both"], default="both")
    parser.add_argument("--max-passes", type=int, default=500)
    parser.add_argument("--verbose", action="store_true", help="list the final nodes and their use")
    parser.add_argument(
        "--spot-to-spot", action="store_true", help="turn the SpotToSpotConsolidation gate on"
    )
    args = parser.parse_args()
    for scenario in ["on-demand", "spot"] if args.scenario == "both" else [args.scenario]:
        run(args.nodes, args.seed, scenario, args.max_passes, args.verbose, args.spot_to_spot)


if __name__ == "__main__":
    main()
