"""What the operator's controls cost a planning pass (MaintenanceWindows, NodeDisruptionBudgets).

    python bench/bench_controls.py                    # 1,000 nodes / 10,000 pods
    python bench/bench_controls.py --nodes 5000 --pods 50000 --windows 20 --ndbs 20

On one generated cluster (bench/gen_cluster.py's shape) the same pass (`plan`, all methods) runs
without controls and with W MaintenanceWindows and K NodeDisruptionBudgets added. The windows are
scheduled, have selectors and are closed at the pass's time (so they block nothing and the two
passes do the same work: the difference is the cost of evaluating them); the budgets select every
node with room to spare. The passes alternate for `--rounds` rounds and the best of each kind counts
(the first pass also warms caches both kinds share). Also timed: `karpflow windows`' report on the
same snapshot. Wall and CPU seconds are printed (the machine is shared: CPU is the steadier figure).
Goal: the controls add less than 10 % to a pass (a 1,000-node pass is a few tenths of a second of
CPU, so its percentage moves with the machine's load: compare the milliseconds, or use --nodes 5000).
"""

from __future__ import annotations

import time

import click

from bench.gen_cluster import bench_spec
from planner.catalog import bundled_catalog
from planner.controls_report import controls_report
from planner.model import PlanOptions
from planner.plan import plan
from planner.snapshot import Snapshot
from sim.cluster_builder import generate_cluster


def timed(work):  # type: ignore[no-untyped-def]
    w0, c0 = time.perf_counter(), time.process_time()
    result = work()
    return result, time.perf_counter() - w0, time.process_time() - c0


def add_controls(builder, windows: int, ndbs: int) -> None:  # type: ignore[no-untyped-def]
    for i in range(windows):
        builder.maintenance_window(
            f"night-{i}",
            actions=["Consolidation", "Drift", "Expiration", "Emptiness"],
            # 02:00-03:00 UTC: closed at the bench's 10:00
            schedules=[{"cron": f"{i % 60} 2 * * *", "duration": "1h"}],
            selector=[{"key": "topology.kubernetes.io/zone", "operator": "Exists"}],
        )
    for i in range(ndbs):
        builder.node_disruption_budget(
            f"zone-{i}",
            selector={"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "Exists"}]},
            max_unavailable="100%",
        )


@click.command()
@click.option("--nodes", default=1000, show_default=True)
@click.option("--pods", default=10000, show_default=True)
@click.option("--windows", default=10, show_default=True)
@click.option("--ndbs", default=10, show_default=True)
@click.option("--rounds", default=5, show_default=True, help="passes of each kind; the best counts")
def main(nodes: int, pods: int, windows: int, ndbs: int, rounds: int) -> None:
    builder = generate_cluster(bench_spec(nodes, pods))
    bare = Snapshot.from_objects(builder.objects, now=builder.now)
    add_controls(builder, windows, ndbs)
    controlled = Snapshot.from_objects(builder.objects, now=builder.now)
    catalog = bundled_catalog("us-west-2")
    options = PlanOptions(all_methods=True)
    # Alternate, several rounds, best of each: the first pass also warms caches both share.
    runs: dict[str, list] = {"bare": [], "controlled": []}
    for _ in range(rounds):
        runs["bare"].append(timed(lambda: plan(bare, catalog, options)))
        runs["controlled"].append(timed(lambda: plan(controlled, catalog, options)))
    base, base_wall, base_cpu = min(runs["bare"], key=lambda r: r[2])
    with_controls, wall, cpu = min(runs["controlled"], key=lambda r: r[2])
    _, report_wall, report_cpu = timed(lambda: controls_report(controlled, catalog))
    same = [c.nodes for c in base.commands] == [c.nodes for c in with_controls.commands]
    click.echo(f"cluster: {len(bare.nodes)} nodes, {len(bare.pods)} pods; {windows} windows, {ndbs} budgets")
    click.echo(
        f"plan without controls: {base_wall:7.2f} s wall {base_cpu:7.2f} s cpu, {len(base.commands)} commands"
    )
    click.echo(
        f"plan with controls:    {wall:7.2f} s wall {cpu:7.2f} s cpu, {len(with_controls.commands)} commands"
    )
    extra = cpu - base_cpu
    click.echo(
        f"controls overhead:     {1000 * extra:+6.0f} ms cpu ({100 * extra / base_cpu:+.1f} %; "
        f"same commands: {same})"
    )
    click.echo(f"karpflow windows report: {report_wall:5.2f} s wall {report_cpu:5.2f} s cpu")


if __name__ == "__main__":
    main()
