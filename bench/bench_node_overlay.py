"""What NodeOverlays cost a planning pass: applying them to the catalog (planner/node_overlay.py), and
a whole pass with the gate on against the same pass with it off.

    python bench/bench_node_overlay.py                          # 10 NodePools, 5 overlays
    python bench/bench_node_overlay.py --pools 50 --overlays 20 --types 700

`--types` grows the bundled table (71 types) with renamed copies, the size of a live catalog. The
overlays are of the kinds users write: a discount per family, a capacity-type surcharge, an
extended resource per family, one pool's own price. Timing is never asserted: run it twice and read
the spread.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

from api.node_overlay import read_node_overlay
from api.nodepool import NodePool
from planner.catalog import Catalog, bundled_catalog
from planner.model import PlanOptions
from planner.node_overlay import apply_node_overlays
from planner.plan import plan
from sim.cluster_builder import ClusterSpec, generate_cluster


def grown(catalog: Catalog, size: int) -> Catalog:
    types = dict(catalog.types)
    copy = 0
    while len(types) < size:
        copy += 1
        for it in catalog:
            if len(types) >= size:
                break
            family, _, rest = it.name.partition(".")
            name = f"{family}x{copy}.{rest}"
            types[name] = dataclasses.replace(it, name=name)
    return Catalog(region=catalog.region, types=types, source=catalog.source)


def overlays(count: int, pools: list[str]) -> list[dict[str, Any]]:
    families = ["m5", "c5", "r5", "m6i", "c6i", "r6i", "t3", "m7i"]
    out = []
    for index in range(count):
        family = families[index % len(families)]
        kind = index % 4
        spec: dict[str, Any]
        if kind == 0:
            spec = {
                "requirements": [
                    {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": [family]}
                ],
                "priceAdjustment": "-10%",
            }
        elif kind == 1:
            spec = {
                "requirements": [
                    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}
                ],
                "priceAdjustment": "+0.01",
            }
        elif kind == 2:
            spec = {
                "requirements": [
                    {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": [family]}
                ],
                "capacity": {f"example.com/dev-{index}": "1"},
            }
        else:
            spec = {
                "requirements": [
                    {"key": "karpenter.sh/nodepool", "operator": "In", "values": [pools[index % len(pools)]]}
                ],
                "price": "0.5",
            }
        spec["weight"] = 1 + index
        out.append(
            {
                "apiVersion": "karpenter.sh/v1alpha1",
                "kind": "NodeOverlay",
                "metadata": {"name": f"o{index}"},
                "spec": spec,
            }
        )
    return out


def best_of(runs: int, work: Callable[[], object]) -> tuple[float, float]:
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        work()
        times.append(time.perf_counter() - began)
    return min(times), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pools", type=int, default=10)
    parser.add_argument("--overlays", type=int, default=5)
    parser.add_argument("--types", type=int, default=71)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    catalog = grown(bundled_catalog("us-west-2"), args.types)
    names = [f"pool-{i}" for i in range(args.pools)]
    pools = [
        NodePool.model_validate({"metadata": {"name": n}, "spec": {"template": {"spec": {}}}}) for n in names
    ]
    read = [read_node_overlay(o) for o in overlays(args.overlays, names)]
    fastest, median = best_of(args.runs, lambda: apply_node_overlays(catalog, read, pools))
    print(
        f"apply {args.overlays} overlays x {args.pools} pools x {len(catalog)} types: "
        f"best {fastest * 1000:.1f} ms, median {median * 1000:.1f} ms"
    )

    builder = generate_cluster(ClusterSpec(nodes=args.nodes, pods=args.nodes * 10, seed=7))
    assert builder.catalog is not None
    pool_names = [o["metadata"]["name"] for o in builder.objects if o["kind"] == "NodePool"]
    for obj in overlays(args.overlays, pool_names):
        builder.add(obj)
    snapshot = builder.snapshot(via_yaml=False)
    for gate in (False, True):
        options = PlanOptions(node_overlay=gate)
        # a fresh snapshot view each run, so each pass applies the overlays again, as a new pass does
        catalog = builder.catalog

        def one_pass(options: PlanOptions = options, catalog: Catalog = catalog) -> object:
            return plan(snapshot.at(snapshot.now), catalog, options)

        fastest, median = best_of(args.runs, one_pass)
        state = "on " if gate else "off"
        print(f"plan, {args.nodes} nodes, gate {state}: best {fastest:.3f} s, median {median:.3f} s")


if __name__ == "__main__":
    main()
