"""An AMI change on a 5,000-node pool: how fast drift fills its budget, batch against one per pass.

    python bench/bench_rollout.py                                # 5,000 nodes / 100,000 pods
    python bench/bench_rollout.py --nodes 1000 --pods 20000 --minutes 4

A planner-level bench with simulated passes (the full emulator stack at 5,000 nodes, with the
kubelets and kube-scheduler simulated, is too slow for this 2-core machine): the controller bench's
generated cluster (sim.cluster_builder.generate_cluster, one NodePool, no node already drifted,
expired or NotReady, consolidateAfter Never so drift alone acts), a Drifted budget of 10 %, then
its EC2NodeClass's `status.amis` moves to a new AMI (every node AMIDrift). Each mode (the batch:
`drift_commands_per_pass` 100, the default; Karpenter's pace: 1) starts from the same cluster:

- a pass is the worker's own: a `SnapshotBuilder` fed watch events (as the informer cache feeds
  it), in-flight nodes held (tainted) as `plan_pass` holds them, `plan()` with the worker's
  PassCache; its wall time is measured and moves the simulated clock, plus `--pass-overhead`
  seconds (modelled: what this bench does not run, Temporal visibility, the activity round trip,
  the children's start) and `--interval` when the pass started nothing (the controller's wait);
- a command is in flight for `--command-minutes` (modelled: launch, registration, drain,
  termination), then its node goes and its replacements join (new AMI, hash stamped) with the pods
  the simulation planned on them; the pods it planned onto existing nodes move there.

Printed per mode: seconds from the change until 500 (the budget) commands are in flight, the most
in flight, nodes replaced per minute over the run, passes, and the largest share of the budget ever
in flight (never above 100 %). Timing is never asserted: the machine may be shared.

Measured on this machine (2 cores shared with other sessions), the defaults: 5,000 nodes / 100,000
pods, a command 3 min, overhead 0.5 s, 6 simulated minutes per mode (2026-12-02):

    batch          500 in flight after   26.0 s; most in flight 500;  83.0 nodes replaced/min over
                   6.0 min; 37 passes (mean 1.70 s, max 10.12 s); at most 100 % of the budget in flight
    one per pass   500 in flight after   never; most in flight 116;  14.4 nodes replaced/min over
                   6.1 min; 201 passes (mean 1.31 s, max 10.17 s); at most 24 % of the budget in flight

The batch fills the budget in 26 s (5 passes of 100; the goal is 60 s) and then replaces what the
budget and the command's duration allow (500 per 3 min: every node of the run finished in the last
3 minutes, ~166/min); one per pass starts a command every ~1.8 s, so at most ~100 run at once with
3-minute commands, whatever the budget (~39/min once they finish). The 10 s passes are the first
of each mode (the simulation prepared from nothing; the worker's PassCache keeps it afterwards).
The run was printed before the "once the first finished" figure was added to the report line.
"""

from __future__ import annotations

import copy
import math
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import click

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gen_cluster import BENCH_REQUESTS, BENCH_TYPES  # noqa: E402
from cluster.informer import RESOURCES  # noqa: E402
from planner.model import PlanOptions  # noqa: E402
from planner.pass_cache import PassCache  # noqa: E402
from planner.plan import plan  # noqa: E402
from planner.snapshot_builder import ADDED, DELETED, MODIFIED, SnapshotBuilder  # noqa: E402
from sim.cluster_builder import ClusterBuilder, ClusterSpec, generate_cluster  # noqa: E402

NEW_AMI = "ami-0rollout000000001"
BUDGET = "10%"


def build(nodes: int, pods: int) -> ClusterBuilder:
    spec = ClusterSpec(
        nodes=nodes,
        pods=pods,
        pools=1,
        deployment_size=20,
        seed=1,
        drifted_fraction=0.0,
        expired_fraction=0.0,
        not_ready_fraction=0.0,
        budgets=[[{"nodes": BUDGET}]],
        pool_types=BENCH_TYPES,
        requests=BENCH_REQUESTS,
    )
    b = generate_cluster(spec)
    for obj in b.objects:
        if obj["kind"] == "NodePool":
            obj["spec"]["disruption"]["consolidateAfter"] = "Never"
    return b


@dataclass
class InFlight:
    node: str
    done_at: float
    replacements: list[tuple[str, str, str, list[str]]]  # (type, zone, capacity type, pod keys)
    placements: dict[str, str]


@dataclass
class Mode:
    """One run of the rollout at one pace, on its own copy of the cluster."""

    name: str
    per_pass: int
    b: ClusterBuilder
    overhead: float
    interval: float
    command_seconds: float
    clock: float = 0.0
    passes: int = 0
    pass_seconds: list[float] = field(default_factory=list)
    in_flight: dict[str, InFlight] = field(default_factory=dict)
    replaced: int = 0
    full_at: float | None = None
    first_done_at: float | None = None
    most: int = 0
    worst_share: float = 0.0
    _version: Iterator[int] = field(default_factory=lambda: iter(range(10**9)))
    _new: int = 0

    def __post_init__(self) -> None:
        self.builder = SnapshotBuilder([r.kind for r in RESOURCES])
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        for obj in self.b.objects:
            self._stamp(obj)
            self.objects[(obj["kind"], _key(obj))] = obj
        kinds: dict[str, list[dict[str, Any]]] = {}
        for obj in self.b.objects:
            kinds.setdefault(obj["kind"], []).append(obj)
        for kind in self.builder.kinds:
            self.builder.replace(kind, kinds.get(kind, []))
        self.cache = PassCache()
        self.options = PlanOptions(drift_commands_per_pass=self.per_pass)
        self.pool = next(o for o in self.b.objects if o["kind"] == "NodePool")["metadata"]["name"]

    def _stamp(self, obj: dict[str, Any]) -> None:
        obj["metadata"]["resourceVersion"] = str(next(self._version))

    def _apply(self, event: str, obj: dict[str, Any]) -> None:
        self._stamp(obj)
        key = (obj["kind"], _key(obj))
        if event == DELETED:
            self.objects.pop(key, None)
        else:
            self.objects[key] = obj
        self.builder.apply(obj["kind"], event, obj)

    def change_ami(self) -> None:
        nodeclass = next(o for o in self.b.objects if o["kind"] == "EC2NodeClass")
        changed = copy.deepcopy(nodeclass)
        changed["status"]["amis"] = [{"id": NEW_AMI, "name": NEW_AMI, "requirements": []}]
        self._apply(MODIFIED, changed)

    # -- the passes ------------------------------------------------------------------------------

    def run(self, seconds: float, target: int) -> None:
        while self.clock < seconds:
            self._complete()
            began = time.perf_counter()
            snapshot = self.builder.snapshot(
                self.b.now + timedelta(seconds=self.clock), self.b.instances, held=set(self.in_flight)
            )
            result = plan(snapshot, self.b.catalog, self.options, cache=self.cache)
            took = time.perf_counter() - began
            self.passes += 1
            self.pass_seconds.append(took)
            self.clock += took + self.overhead
            for command in result.commands_:
                if command.method != "drift":
                    continue
                (candidate,) = command.candidates
                self.in_flight[candidate.name] = InFlight(
                    candidate.name,
                    self.clock + self.command_seconds,
                    [
                        (r.instance_types[0].name, r.zones[0], r.capacity_type, [p.key for p in r.pods])
                        for r in command.replacements
                    ],
                    dict(command.placements),
                )
            counted = result.budget_nodes[self.pool].nodes
            allowed = math.ceil(int(BUDGET[:-1]) * counted / 100)
            self.worst_share = max(self.worst_share, len(self.in_flight) / allowed)
            self.most = max(self.most, len(self.in_flight))
            if self.full_at is None and len(self.in_flight) >= target:
                self.full_at = self.clock
            if not result.commands_:
                self.clock += self.interval

    def _complete(self) -> None:
        for name in [n for n, f in self.in_flight.items() if f.done_at <= self.clock]:
            done = self.in_flight.pop(name)
            self._replace(done)
            self.replaced += 1
            if self.first_done_at is None:
                self.first_done_at = done.done_at

    def _replace(self, done: InFlight) -> None:
        """The node goes; its replacements join with the pods planned on them; the others move to
        the existing nodes the simulation chose."""
        destinations = dict(done.placements)
        for itype, zone, capacity_type, pods in done.replacements:
            self._new += 1
            name = f"rollout-{self._new}"
            node = self.b.node(
                name, pool=self.pool, instance_type=itype, zone=zone, capacity_type=capacity_type, ami=NEW_AMI
            )
            self._apply(ADDED, node)
            destinations.update(dict.fromkeys(pods, name))
        for (kind, key), obj in list(self.objects.items()):
            if kind != "Pod" or (obj.get("spec") or {}).get("nodeName") != done.node:
                continue
            target = destinations.get(key)
            if target is None:
                self._apply(DELETED, obj)  # DaemonSet pods (and any the simulation left Pending)
                continue
            moved = copy.deepcopy(obj)
            moved["spec"]["nodeName"] = target
            self._apply(MODIFIED, moved)
        self._apply(DELETED, self.objects[("Node", f"/{done.node}")])

    # -- the figures -----------------------------------------------------------------------------

    def report(self, target: int) -> str:
        full = f"{self.full_at:6.1f} s" if self.full_at is not None else "  never"
        per_minute = self.replaced / (self.clock / 60) if self.clock else 0.0
        since = self.first_done_at
        steady = (
            self.replaced / ((self.clock - since) / 60) if since is not None and self.clock > since else 0.0
        )
        mean = sum(self.pass_seconds) / len(self.pass_seconds)
        return (
            f"{self.name:<14} {target} in flight after {full}; most in flight {self.most}; "
            f"{per_minute:5.1f} nodes replaced/min over {self.clock / 60:.1f} min "
            f"({steady:.1f}/min once the first finished); {self.passes} passes "
            f"(mean {mean:.2f} s, max {max(self.pass_seconds):.2f} s); at most "
            f"{100 * self.worst_share:.0f} % of the budget in flight"
        )


def _key(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace') or ''}/{meta['name']}"


@click.command()
@click.option("--nodes", default=5000, show_default=True)
@click.option("--pods", default=100000, show_default=True)
@click.option("--minutes", default=6.0, show_default=True, help="simulated minutes per mode")
@click.option("--command-minutes", default=3.0, show_default=True, help="a drift command's duration")
@click.option("--pass-overhead", default=0.5, show_default=True, help="seconds a pass costs beyond plan()")
@click.option("--interval", default=10.0, show_default=True, help="wait after a pass that started nothing")
@click.option("--batch", default=PlanOptions().drift_commands_per_pass, show_default=True)
def main(
    nodes: int,
    pods: int,
    minutes: float,
    command_minutes: float,
    pass_overhead: float,
    interval: float,
    batch: int,
) -> None:
    began = time.perf_counter()
    base = build(nodes, pods)
    target = math.ceil(int(BUDGET[:-1]) * nodes / 100)
    click.echo(f"generated {nodes} nodes / {pods} pods in {time.perf_counter() - began:.0f} s", err=True)
    for name, per_pass in (("batch", batch), ("one per pass", 1)):
        mode = Mode(name, per_pass, copy.deepcopy(base), pass_overhead, interval, command_minutes * 60)
        mode.change_ami()
        mode.run(minutes * 60, target)
        click.echo(mode.report(target))


if __name__ == "__main__":
    main()
