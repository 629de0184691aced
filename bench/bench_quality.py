"""Decision quality of consolidation: how close to the cheapest possible cluster do plans get?

Start from a fragmented cluster (nodes of assorted sizes, each 15-45 % used by small Deployments),
then repeat: plan a pass (emptiness, drift, multi- and single-node consolidation, Karpenter's order;
the first method with commands ends the pass), apply it, advance the clock a minute. Stop when a pass
plans nothing. Applying a command = remove its nodes, launch each replacement as its cheapest option
(cheapest zone for its capacity type), and bind every moved pod where the planner's simulation put
it (the command's placements on existing nodes, or the replacement it was packed onto); after each
command every node is checked, independently of the simulation, to hold no more than its allocatable.
Binding pods where the simulation put them is the optimistic part: a real kube-scheduler places the
evicted pods by its own scoring, not the planner's.

Two scenarios: "on-demand" (the NodePool allows on-demand only) and "spot" (it allows spot and
on-demand; the cluster starts on-demand, so replacements are spot and, with spot-to-spot off, can
then only be deleted).

References, all computed on what the NodePool may launch (its requirements against the catalog,
the cheapest offering each type may use: spot prices in the spot scenario):
- lower bound (the issue's yardstick, deliberately optimistic): the pods' total requests priced at
  the cheapest $/vCPU and the cheapest $/GiB, whichever is higher, on instance capacity:
      bound = max(total_cpu x min(price / vCPU), total_memory x min(price / GiB))
  It ignores kube-reserved, DaemonSets and that the cheapest $/vCPU type (c5) cannot hold the
  memory: even the fluid optimum below is ~5 % above it.
- fluid optimum: the cheapest mix of fractional nodes whose allocatable (net of DaemonSets) covers
  the total cpu and memory; still a lower bound for any packing, and a tighter one.
- pod-shape bound: the same with each pod whole on one node type (a linear program): a type's cpu
  and memory must hold the pods given to it together, where the fluid optimum lets one type's cpu
  and another's memory serve the same pods. Still a lower bound for any packing, and the tightest
  here: with these pods (mostly 2 GiB per vCPU, between c5's 1.8 and m5's 3.7) it is about 7 %
  above the fluid optimum on-demand and 8 % with spot.
- full repack (a reference, not a bound): every pod placed at once on fresh nodes by the planner's
  cost-aware packing (planner/scheduling/packing.py), with no budgets and no step-by-step rule.
  Roughly what a good packing of these pods reaches; consolidation moves in strictly cheaper steps
  from the fragmented start, so it is not expected to beat it.

Run: .venv/bin/python bench/bench_quality.py [--nodes 200] [--seeds 1,2,3] [--scenario on-demand|spot]
     [--strategy karpenter|optimal|both] [--churn-share 0.15] [--max-replacements N] [--spot-to-spot]
     [--verbose]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import highspy
import numpy as np

from api.constants import CAPACITY_ON_DEMAND, CAPACITY_SPOT, CAPACITY_TYPE_LABEL
from planner.catalog import Catalog
from planner.model import Command, PlanOptions
from planner.optimal.solver import new_highs
from planner.plan import Plan, plan
from planner.scheduling.adapter import SnapshotSimulation
from planner.snapshot import Snapshot
from sim.cluster_builder import ClusterBuilder

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


def launchable(builder: ClusterBuilder) -> list[tuple[str, float, tuple[int, int], tuple[int, int]]]:
    """What the NodePool may launch, as the planner sees it (its requirements against the catalog):
    (type, cheapest allowed offering's price, capacity (cpu m, memory B), allocatable net of
    DaemonSets (cpu m, memory B))."""
    assert builder.catalog is not None
    return launchable_in(builder.snapshot(via_yaml=False), builder.catalog)


def launchable_in(
    snapshot: Snapshot, catalog: Catalog
) -> list[tuple[str, float, tuple[int, int], tuple[int, int]]]:
    sim = SnapshotSimulation(snapshot, catalog).simulator
    out = []
    for pool in sim.pools:
        for e in sim.pool_types(pool):
            out.append((e.name, e.price, (e.capacity[0], e.capacity[1]), (e.alloc[0], e.alloc[1])))
    return out


def requested(builder: ClusterBuilder) -> tuple[int, int]:
    """Total (cpu m, memory B) requested by the pods that consolidation moves (not DaemonSets)."""
    pods = [p for p in builder.snapshot(via_yaml=False).pods if not p.is_daemonset]
    return sum(p.requests.cpu for p in pods), sum(p.requests.memory for p in pods)


def lower_bound(builder: ClusterBuilder) -> float:
    """max(total cpu x cheapest $/vCPU, total memory x cheapest $/GiB) over the NodePool's launchable
    offerings, on instance capacity (module docstring)."""
    cpu, mem = requested(builder)
    types = launchable(builder)
    per_cpu = min(price / cap[0] for _, price, cap, _ in types)
    per_byte = min(price / cap[1] for _, price, cap, _ in types)
    return max(cpu * per_cpu, mem * per_byte)


def fluid_optimum(builder: ClusterBuilder) -> float:
    """A tighter reference, still a lower bound for any packing: the cheapest mix of fractional nodes
    whose allocatable (net of DaemonSets) covers the total cpu and memory. A 2-constraint LP, so some
    optimum uses at most two instance types: try every type alone and every pair."""
    assert builder.catalog is not None
    return fluid_optimum_of(builder.snapshot(via_yaml=False), builder.catalog)


def fluid_optimum_of(snapshot: Snapshot, catalog: Catalog) -> float:
    """`fluid_optimum` on a snapshot (every pod but DaemonSet pods) and a catalog."""
    pods = [p for p in snapshot.pods if not p.is_daemonset and not p.is_terminal]
    need_cpu, need_mem = sum(p.requests.cpu for p in pods), sum(p.requests.memory for p in pods)
    shapes = [(price, alloc[0], alloc[1]) for _, price, _, alloc in launchable_in(snapshot, catalog)]
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


def pod_shape_bound(snapshot: Snapshot, catalog: Catalog, pinned: Collection[str] = ()) -> float:
    """A lower bound for any packing, tighter than the fluid optimum: each pod sits whole on one node,
    so a node type's cpu and memory must hold the pods given to it together (the fluid optimum lets
    one type's cpu and another's memory serve the same pods). A linear program over fractional nodes
    of every type the NodePool may launch; `pinned` nodes (whose pods cannot move: do-not-disrupt)
    stay, at their own price, and lend their free room."""
    pods = [p for p in snapshot.pods if not p.is_daemonset and not p.is_terminal]
    moving = Counter((p.requests.cpu, p.requests.memory) for p in pods if p.node_name not in pinned)
    shapes = sorted(moving)
    kinds = [(price, alloc) for _, price, _, alloc in launchable_in(snapshot, catalog)]
    fixed_cost, rooms = 0.0, []
    for name in sorted(pinned):
        node = snapshot.nodes[name]
        kind = catalog.get(node.instance_type)
        fixed_cost += (kind.price(node.zone or "", node.capacity_type or "") or 0.0) if kind else 0.0
        used = [sum(p.requests.cpu for p in node.pods), sum(p.requests.memory for p in node.pods)]
        rooms.append((node.allocatable.cpu - used[0], node.allocatable.memory - used[1]))
    h = new_highs()
    inf = highspy.kHighsInf
    # Columns: one per node type (fractional count, at its price), then pods of each shape per type
    # and per pinned node's room.
    columns = [(price, inf) for price, _ in kinds] + [(0.0, inf)] * (len(shapes) * (len(kinds) + len(rooms)))
    h.addVars(len(columns), np.zeros(len(columns)), np.array([u for _, u in columns]))
    h.changeColsCost(len(columns), np.arange(len(columns), dtype=np.int32), np.array([c for c, _ in columns]))

    def x(s: int, t: int) -> int:
        return len(kinds) + s * (len(kinds) + len(rooms)) + t

    def add_row(terms: list[tuple[int, float]], lower: float, upper: float) -> None:
        h.addRow(
            lower,
            upper,
            len(terms),
            np.array([t for t, _ in terms], dtype=np.int32),
            np.array([v for _, v in terms]),
        )

    for s, shape in enumerate(shapes):
        add_row([(x(s, t), 1.0) for t in range(len(kinds) + len(rooms))], moving[shape], moving[shape])
    for d, scale in ((0, 1000.0), (1, float(GIB))):
        for t, (_, alloc) in enumerate(kinds):
            add_row(
                [*((x(s, t), shape[d] / scale) for s, shape in enumerate(shapes)), (t, -alloc[d] / scale)],
                -inf,
                0.0,
            )
        for r, room in enumerate(rooms):
            t = len(kinds) + r
            add_row(
                [(x(s, t), shape[d] / scale) for s, shape in enumerate(shapes)], -inf, max(room[d], 0) / scale
            )
    h.run()
    return fixed_cost + h.getInfo().objective_function_value


def repack_reference(builder: ClusterBuilder) -> tuple[float, int]:
    """Not a bound: what the planner's cost-aware packing gets by placing every pod on fresh nodes at
    once (no budgets, no strictly-cheaper steps), i.e. roughly what a good packing can reach."""
    snapshot = builder.snapshot(via_yaml=False)
    result = SnapshotSimulation(snapshot, builder.catalog).run(list(snapshot.nodes), packing="cost")
    assert result.all_non_pending_scheduled, result.non_pending_errors()
    return sum(claim.cheapest_price for claim in result.replacements), len(result.replacements)


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


def apply(builder: ClusterBuilder, command: Command, counter: list[int]) -> None:
    """Remove the command's nodes, launch each replacement as its cheapest option (cheapest zone for its
    capacity type), and bind every moved pod where the planner's simulation put it (the command's
    placements on existing nodes, or the replacement it was packed onto)."""
    placements = dict(command.placements)
    for replacement in command.replacements:
        best = replacement.instance_types[0]
        offers = [
            o
            for o in best.offerings
            if o.available and o.capacity_type == replacement.capacity_type and o.zone in replacement.zones
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
            annotations=replacement.annotations,  # the DisruptionWorkflow writes them at registration
        )
        for ds in (o for o in list(builder.objects) if o.get("kind") == "DaemonSet"):
            requests = ds["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
            builder.daemonset_pod(
                name, ds["metadata"]["name"], cpu=requests["cpu"], memory=requests["memory"]
            )
        placements.update((pod.key, name) for pod in replacement.pods)
    gone = set(command.nodes)
    moved = {p.key for c in command.candidates for p in c.reschedulable_pods}
    unplaced = sorted(moved - placements.keys())
    assert not unplaced, f"{command}: no place for {unplaced[:5]}"
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
    check_fits(builder)


def apply_markers(builder: ClusterBuilder, result: Plan) -> None:
    """What the controller does with a pass's node annotations and `karpflow.io/leaving` taints
    (activities `apply_annotations`, `apply_taints`): Optimal consolidation holds its plan in them."""
    nodes = {o["metadata"]["name"]: o for o in builder.objects if o.get("kind") == "Node"}
    for change in result.annotations:
        node = nodes.get(change.node)
        if node is None:
            continue
        annotations = node["metadata"].setdefault("annotations", {})
        if change.value is None:
            annotations.pop(change.key, None)
        else:
            annotations[change.key] = change.value
    for taint in result.taints:
        node = nodes.get(taint.node)
        if node is None:
            continue
        taints = [
            t
            for t in node["spec"].get("taints") or []
            if not (t.get("key") == taint.key and t.get("effect") == taint.effect)
        ]
        if taint.add:
            taints.append({"key": taint.key, "effect": taint.effect})
        node["spec"]["taints"] = taints


def check_fits(builder: ClusterBuilder) -> None:
    """Independent of the simulation: no node holds more than its allocatable."""
    snapshot = builder.snapshot(via_yaml=False)
    for node in snapshot.nodes.values():
        used = [0, 0, 0]
        for p in node.pods:
            if not p.is_terminal:
                used[0] += p.requests.cpu
                used[1] += p.requests.memory
                used[2] += 1
        alloc = node.allocatable
        assert used[0] <= alloc.cpu and used[1] <= alloc.memory and used[2] <= alloc.pods, (
            f"{node.name} ({node.instance_type}) overcommitted: {used} > {alloc}"
        )


def describe_nodes(builder: ClusterBuilder) -> None:
    snapshot = builder.snapshot(via_yaml=False)
    catalog = builder.catalog
    assert catalog is not None
    for node in sorted(snapshot.nodes.values(), key=lambda n: n.name):
        it = catalog.get(node.instance_type)
        price = it.price(node.zone or "", node.capacity_type or "") if it else None
        used_cpu = sum(p.requests.cpu for p in node.pods if not p.is_terminal)
        used_mem = sum(p.requests.memory for p in node.pods if not p.is_terminal)
        print(
            f"    {node.name:10s} {node.instance_type:12s} {node.capacity_type:9s} ${price or 0:.3f}/h  "
            f"cpu {used_cpu / node.allocatable.cpu:5.0%}  memory {used_mem / node.allocatable.memory:5.0%}"
        )


@dataclass
class Outcome:
    gap: float  # end cost vs the lower bound
    fluid_gap: float  # end cost vs the fluid optimum
    repack_gap: float  # full repack reference vs the lower bound
    evicted: int
    disrupted: int
    commands: int
    shape_gap: float  # end cost vs the pod-shape bound
    shape_over_fluid: float  # how far the pod-shape bound itself is above the fluid optimum


def run(
    nodes: int, seed: int, scenario: str, options: PlanOptions, max_passes: int, verbose: bool = False
) -> Outcome:
    """Plan and apply until a pass plans nothing; print the figures. Returns the gaps to the lower
    bound of the end cost, of the end cost to the fluid optimum, and of the full repack reference."""
    builder = fragmented_cluster(nodes, seed, scenario)
    catalog = builder.catalog
    assert catalog is not None
    bound, fluid = lower_bound(builder), fluid_optimum(builder)
    shape = pod_shape_bound(builder.snapshot(via_yaml=False), catalog)
    repack, repack_nodes = repack_reference(builder)
    cpu, mem = requested(builder)
    start_cost, start_nodes = cluster_cost(builder)
    print(
        f"scenario {scenario}, seed {seed}: {start_nodes} nodes, {cpu / 1000:.1f} vCPU, {mem / GIB:.1f} GiB"
    )
    start_gap = start_cost / bound - 1
    print(f"  start          ${start_cost:8.3f}/h  {start_nodes:4d} nodes  {start_gap:+7.1%} vs bound")
    counter = [0]
    passes = commands = evicted = disrupted = 0
    by_method: dict[str, int] = {}
    plan_seconds = solver_max = 0.0
    for _ in range(max_passes):
        snapshot = builder.snapshot(via_yaml=False)
        started = time.perf_counter()
        result = plan(snapshot, catalog, options)
        plan_seconds += time.perf_counter() - started
        if result.target_fleet is not None:
            target = result.target_fleet
            solver_max = max(solver_max, target.target_seconds + target.step_seconds)
        chosen = [c for c in result.commands_ if c.method != "expiration"]
        apply_markers(builder, result)
        if not chosen:
            break
        passes += 1
        for command in chosen:
            evicted += sum(len(c.reschedulable_pods) for c in command.candidates)
            disrupted += len(command.nodes)
            apply(builder, command, counter)
            commands += 1
            key = f"{command.method}/{command.decision}"
            if len(command.replacements) > 1:
                key += "-with-several"
            by_method[key] = by_method.get(key, 0) + 1
        builder.now += timedelta(minutes=1)
    end_cost, end_nodes = cluster_cost(builder)
    gap, fluid_gap = end_cost / bound - 1, end_cost / fluid - 1
    print(f"  end            ${end_cost:8.3f}/h  {end_nodes:4d} nodes  {gap:+7.1%} vs bound")
    print(f"  lower bound    ${bound:8.3f}/h")
    repack_gap = repack / bound - 1
    print(
        f"  full repack    ${repack:8.3f}/h  {repack_nodes:4d} nodes  {repack_gap:+7.1%} vs bound (reference)"
    )
    print(f"  fluid optimum  ${fluid:8.3f}/h  (fractional, allocatable - DaemonSets): end {fluid_gap:+.1%}")
    shape_gap = end_cost / shape - 1
    print(
        f"  pod-shape bound ${shape:7.3f}/h  ({shape / fluid - 1:+.1%} vs fluid: pods whole on a node): "
        f"end {shape_gap:+.1%}"
    )
    methods = ", ".join(f"{k} {v}" for k, v in sorted(by_method.items()))
    print(f"  {passes} passes, {commands} commands ({methods}), planning {plan_seconds:.1f} s")
    solver = f", solver at most {solver_max:.2f} s a pass" if solver_max else ""
    print(f"  {disrupted} nodes disrupted, {evicted} pods evicted{solver}")
    if verbose:
        describe_nodes(builder)
    return Outcome(gap, fluid_gap, repack_gap, evicted, disrupted, commands, shape_gap, shape / fluid - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated cluster seeds")
    parser.add_argument("--scenario", choices=["on-demand", "spot", "both"], default="both")
    parser.add_argument(
        "--strategy",
        choices=["karpenter", "optimal", "both"],
        default="both",
        help="consolidation strategy of the NodePool (both: side by side on the same seeds)",
    )
    parser.add_argument("--max-passes", type=int, default=500)
    parser.add_argument("--verbose", action="store_true", help="list the final nodes and their use")
    parser.add_argument(
        "--spot-to-spot", action="store_true", help="turn the SpotToSpotConsolidation gate on"
    )
    parser.add_argument(
        "--churn-share",
        type=float,
        default=PlanOptions().optimal_churn_share,
        help="Optimal: what moving every pod costs, as a share of the fluid optimum (higher: fewer "
        "evictions, dearer fleet)",
    )
    parser.add_argument(
        "--max-replacements",
        type=int,
        default=1,
        help="karpflow extension: new nodes a multi-node replace may launch (1 = Karpenter)",
    )
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    strategies = ["Karpenter", "Optimal"] if args.strategy == "both" else [args.strategy.capitalize()]
    summary = []
    for scenario in ["on-demand", "spot"] if args.scenario == "both" else [args.scenario]:
        for strategy in strategies:
            options = PlanOptions(
                spot_to_spot=args.spot_to_spot,
                max_replacements=args.max_replacements,
                consolidation_strategy=strategy,  # type: ignore[arg-type]
                optimal_churn_share=args.churn_share,
            )
            print(f"== strategy {strategy}")
            outcomes = [
                run(args.nodes, seed, scenario, options, args.max_passes, args.verbose) for seed in seeds
            ]
            summary.append((scenario, strategy, outcomes))
    print(
        f"summary ({args.nodes} nodes, max-replacements {args.max_replacements}, "
        f"spot-to-spot {args.spot_to_spot}, Optimal churn share {args.churn_share}):"
    )
    for scenario, strategy, outcomes in summary:
        fluid = " ".join(f"{o.fluid_gap:+.1%}" for o in outcomes)
        shape = " ".join(f"{o.shape_gap:+.1%}" for o in outcomes)
        floor = " ".join(f"{o.shape_over_fluid:+.1%}" for o in outcomes)
        bound = " ".join(f"{o.gap:+.1%}" for o in outcomes)
        evicted = " ".join(str(o.evicted) for o in outcomes)
        disrupted = " ".join(str(o.disrupted) for o in outcomes)
        commands = " ".join(str(o.commands) for o in outcomes)
        print(
            f"  {scenario:9s} {strategy:9s} seeds {args.seeds}: end vs fluid optimum {fluid} "
            f"(pod-shape bound {floor}) | vs pod-shape bound {shape} | vs bound {bound} "
            f"| pods evicted {evicted} | nodes disrupted {disrupted} | commands {commands}"
        )


if __name__ == "__main__":
    main()
