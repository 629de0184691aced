"""Solver time per pass of Optimal consolidation on large fragmented clusters.

    python bench/bench_optimal_solver.py [--nodes 1000] [--passes 3]

Builds bench_quality's fragmented cluster (on-demand pool, nodes 15-45 % used) with `--nodes` nodes
that all hold pods (the generator leaves some empty: they are dropped, so every node is a candidate
of the Optimal method from the first pass, not after emptiness), then plans and applies
passes with the Optimal strategy and prints, per pass, the solver's time for the target and for the
step (the goal: under 2 s together at 1,000 nodes, `PlanOptions.optimal_time_limit` bounds both),
the model's size, the whole pass's time and what it decided.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_quality import apply, apply_markers, cluster_cost, fluid_optimum, fragmented_cluster

from planner.model import PlanOptions
from planner.plan import plan


def busy_cluster(nodes: int, seed: int):
    """bench_quality's cluster with `nodes` nodes, none of them empty."""
    builder = fragmented_cluster(nodes * 3, seed, "on-demand")
    busy = {
        o["spec"]["nodeName"]
        for o in builder.objects
        if o["kind"] == "Pod" and o["metadata"]["name"].startswith("app-")
    }
    keep = sorted(busy)[:nodes]
    kept = set(keep)
    builder.objects[:] = [
        o
        for o in builder.objects
        if (o["kind"] != "Node" or o["metadata"]["name"] in kept)
        and (o["kind"] != "Pod" or o["spec"].get("nodeName") in kept)
    ]
    return builder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    builder = busy_cluster(args.nodes, args.seed)
    options = PlanOptions(consolidation_strategy="Optimal")
    counter = [0]
    print(f"{args.nodes} nodes, fluid optimum ${fluid_optimum(builder):.3f}/h")
    for index in range(1, args.passes + 1):
        snapshot = builder.snapshot(via_yaml=False)
        began = time.perf_counter()
        result = plan(snapshot, builder.catalog, options)
        seconds = time.perf_counter() - began
        target = result.target_fleet
        cost, nodes = cluster_cost(builder)
        line = f"pass {index}: {nodes} nodes ${cost:.3f}/h, plan {seconds:.2f} s"
        if target is not None:
            solver = target.target_seconds + target.layout_seconds + target.step_seconds
            line += (
                f", solver {solver:.2f} s ({target.target_seconds:.2f} s target + "
                f"{target.layout_seconds:.2f} s layout + {target.step_seconds:.2f} s step; {target.status}; "
                f"{target.nodes} candidates, target ${target.target_cost:.3f}/h)"
            )
            if target.plan is not None:
                line += f", plan {target.plan.id} {target.plan.state}"
        commands = [c for c in result.commands_ if c.method != "expiration"]
        line += "; " + (", ".join(f"{c.method} {c.decision} {len(c.nodes)}" for c in commands) or "nothing")
        print(line, flush=True)
        apply_markers(builder, result)
        if not commands:
            break
        for command in commands:
            apply(builder, command, counter)
        builder.now += timedelta(minutes=1)


if __name__ == "__main__":
    main()
