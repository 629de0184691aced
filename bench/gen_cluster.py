"""Write a synthetic cluster as `kubectl get ... -o json|yaml` would print it.

    python bench/gen_cluster.py --nodes 1000 --pods 20000 --out /tmp/cluster.json

N nodes across several NodePools, zones and instance types; Deployments with realistic requests
(never beyond allocatable), DaemonSet pods on every node, PDBs (some allowing no disruption),
do-not-disrupt pods, drifted (stale AMI), expired, NotReady and empty nodes. The generator itself
is `sim.cluster_builder.generate_cluster`, shared with the property tests.
"""

from __future__ import annotations

import click

from sim.cluster_builder import ClusterBuilder, ClusterSpec, generate_cluster

# Bigger nodes and smaller pods than the test default, so 20 pods per node fit like in production.
BENCH_TYPES = {
    "general": ["m5.2xlarge", "m6i.2xlarge", "m7i.2xlarge", "m5.4xlarge", "m6i.xlarge"],
    "compute": ["c5.2xlarge", "c6i.2xlarge", "c7i.4xlarge", "c6i.4xlarge"],
    "memory": ["r5.xlarge", "r6i.2xlarge", "r7i.2xlarge"],
    "arm": ["m6g.2xlarge", "c6g.2xlarge", "m7g.2xlarge", "r6g.xlarge"],
}
BENCH_REQUESTS = [("50m", "64Mi"), ("100m", "128Mi"), ("100m", "256Mi"), ("250m", "256Mi"), ("250m", "512Mi")]


def bench_spec(nodes: int, pods: int, seed: int = 7) -> ClusterSpec:
    return ClusterSpec(
        nodes=nodes,
        pods=pods,
        pools=4,
        deployment_size=20,
        seed=seed,
        pool_types=BENCH_TYPES,
        requests=BENCH_REQUESTS,
    )


def generate(nodes: int, pods: int, seed: int = 7) -> ClusterBuilder:
    return generate_cluster(bench_spec(nodes, pods, seed))


@click.command()
@click.option("--nodes", default=1000, show_default=True)
@click.option("--pods", default=20000, show_default=True)
@click.option("--seed", default=7, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="*.json or *.yaml")
def main(nodes: int, pods: int, seed: int, out: str) -> None:
    builder = generate(nodes, pods, seed)
    path = builder.write(out)
    kinds: dict[str, int] = {}
    for obj in builder.objects:
        kinds[obj["kind"]] = kinds.get(obj["kind"], 0) + 1
    summary = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    click.echo(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB): {summary}")


if __name__ == "__main__":
    main()
