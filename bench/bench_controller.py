"""The controller's planning pass at scale: time and memory of `controller_plan` on an informer cache
holding a generated cluster (bench/gen_cluster.py), and the Kubernetes requests one pass sends.

    .venv/bin/python bench/bench_controller.py --nodes 1000 --nodes 5000

The pass reads the worker's informer cache (cluster/informer.py), so it sends no Kubernetes request
of its own; the figure printed is the informer's request counter across the pass (expected 0).
"""

from __future__ import annotations

import asyncio
import os
import resource
import sys
import time
from collections.abc import Iterator
from typing import Any

import click

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from activities.planning import PlanningActivities
from api.controller_io import PassInput
from bench.gen_cluster import generate


class CachedInformer:
    """The part of cluster.informer.Informer a pass uses, filled from a generated cluster."""

    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self._objects = objects
        self.synced = True
        self.requests = 0

    def objects(self) -> Iterator[dict[str, Any]]:
        return iter(self._objects)


async def one(nodes: int, pods: int, passes: int) -> None:
    builder = generate(nodes, pods)
    informer = CachedInformer(list(builder.objects))
    planning = PlanningActivities(informer, kube=None, client=None, region="us-west-2")  # type: ignore[arg-type]
    times = []
    commands = sent = 0
    for _ in range(passes):
        before = informer.requests
        started = time.perf_counter()
        out = await planning.plan_pass(PassInput())
        times.append(time.perf_counter() - started)
        commands = len(out.commands)
        sent = informer.requests - before
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    click.echo(
        f"{nodes} nodes / {pods} pods: pass {min(times):.2f}s best, {max(times):.2f}s worst of {passes}; "
        f"{commands} command(s); peak RSS {rss:.0f} MiB; Kubernetes requests sent by the pass: {sent}"
    )


@click.command()
@click.option("--nodes", "sizes", multiple=True, type=int, default=[1000, 5000], show_default=True)
@click.option("--pods-per-node", default=20, show_default=True)
@click.option("--passes", default=2, show_default=True)
def main(sizes: tuple[int, ...], pods_per_node: int, passes: int) -> None:
    for nodes in sizes:
        asyncio.run(one(nodes, nodes * pods_per_node, passes))


if __name__ == "__main__":
    main()
