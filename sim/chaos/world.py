"""The chaos run's cluster: fragmented, with work for every disruption method, from a seed.

Built with the demo's generator (sim/scenarios/generate_demo.py), so nodes, pods, PDBs and NodePools
have the shape `kubectl get -o yaml` prints and the same catalog numbers the planner reads:

- NodePool `default` (amd64, on-demand and spot, us-west-2a/b) with a short consolidateAfter and a
  `terminationGracePeriod` (`drain_deadline`, wall time: it bounds the drains PDBs block), and the
  demo's spot-only, tainted `batch` pool, WhenEmpty, whose template the churn edits (drift);
- nearly empty and empty nodes (consolidation, emptiness), expired nodes and nodes that expire a
  few seconds into the run (expiration), nodes with a stale NodePool hash (drift), spot nodes (the
  interruption messages name them), busy nodes;
- workloads with PDBs (maxUnavailable 1, minAvailable 50 %), one whose PDB never allows an eviction
  (minAvailable = replicas: only the grace-period deadline moves it), pods that ignore eviction (a
  long terminationGracePeriodSeconds: Terminating for that long, scaled by the simulator), a
  do-not-disrupt pod, and the demo's node-exporter DaemonSet.

Everything random comes from the seed. Workloads request little, so the pods of any one node fit on
the others (the simulator has no provisioner: a pod nothing can place would be "lost").
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from api import constants as k
from api.nodepool import NodePool
from planner.drift import nodepool_hash_annotations
from sim.scenario import Scenario, scenario_from_documents
from sim.scenarios import generate_demo as gen

# A node this much younger than expireAfter expires this many seconds into the run.
EXPIRE_AFTER = timedelta(hours=720)
DEFAULT_TYPES = ("m5.large", "m5.xlarge", "c5.xlarge", "r5.large", "m5.2xlarge")
ZONES = {"us-west-2a": 1, "us-west-2b": 17}  # the third octet where moto's default subnet starts


@dataclass
class World:
    """The scenario and what the harness needs to know about it."""

    scenario: Scenario
    nodes: list[gen.DemoNode]
    spot_nodes: list[str]
    expired: list[str]
    expiring: list[str]
    drifted: list[str]
    notes: dict[str, str] = field(default_factory=dict)


def _ip(zone: str, index: int) -> str:
    # One node per last octet: the generator places pods by it.
    return f"172.31.{ZONES[zone] + index % 8}.{10 + index}"


def build_world(
    seed: int, nodes: int = 16, drain_deadline: str = "60s", consolidate_after: str = "20s"
) -> World:
    rng = random.Random(seed)
    roles = ["busy"] * max(3, nodes // 4)
    roles += ["nearly-empty"] * max(2, nodes // 5)
    roles += ["empty", "expired", "expiring", "drifted", "drifted-stubborn", "slow-stop", "do-not-disrupt"]
    roles += ["spot"] * max(2, nodes // 6)
    roles += ["busy"] * max(0, nodes - 2 - len(roles))
    rng.shuffle(roles)
    demo_nodes: list[gen.DemoNode] = []
    for index, role in enumerate(roles):
        zone = rng.choice(sorted(ZONES))
        capacity = "spot" if role == "spot" or rng.random() < 0.15 else "on-demand"
        instance_type = "m5.xlarge" if role in ("busy", "drifted-stubborn") else rng.choice(DEFAULT_TYPES)
        age = timedelta(days=rng.randint(1, 20), minutes=rng.randint(0, 600))
        if role == "expired":
            age = EXPIRE_AFTER + timedelta(hours=rng.randint(1, 48))
        elif role == "expiring":
            age = EXPIRE_AFTER - timedelta(seconds=rng.randint(15, 45))
        demo_nodes.append(
            gen.DemoNode(
                _ip(zone, index),
                instance_type,
                zone,
                capacity,
                "default",
                age,
                role,
                stale_hash=role.startswith("drifted"),
            )
        )
    # Two batch nodes (spot, tainted, WhenEmpty): one busy, one empty.
    for index, note in ((len(roles), "batch, busy"), (len(roles) + 1, "batch, empty")):
        zone = rng.choice(sorted(ZONES))
        demo_nodes.append(
            gen.DemoNode(_ip(zone, index), "c5.xlarge", zone, "spot", "batch", timedelta(days=2), note)
        )
    workloads = _workloads(rng, demo_nodes)
    listing = copy.deepcopy(gen.scenario_list([replace(n, pods=[]) for n in demo_nodes], workloads))
    _tune_nodepools(listing, drain_deadline, consolidate_after)
    scenario = scenario_from_documents([listing], f"chaos world (seed {seed})")
    by_role: dict[str, list[str]] = {}
    for n in demo_nodes:
        by_role.setdefault(n.note, []).append(n.name)
    return World(
        scenario=scenario,
        nodes=demo_nodes,
        spot_nodes=[n.name for n in demo_nodes if n.capacity_type == "spot"],
        expired=by_role.get("expired", []),
        expiring=by_role.get("expiring", []),
        drifted=by_role.get("drifted", []) + by_role.get("drifted-stubborn", []),
        notes={n.name: n.note for n in demo_nodes},
    )


def _suffix(node: gen.DemoNode) -> str:
    return node.ip.rsplit(".", 1)[-1]


def _workloads(rng: random.Random, nodes: list[gen.DemoNode]) -> list[gen.Workload]:
    default = [n for n in nodes if n.pool == "default"]
    by_role = {n.note: n for n in default}
    busy = [n for n in default if n.note in ("busy", "spot", "expired", "expiring", "drifted")]
    nearly_empty = [n for n in default if n.note == "nearly-empty"]

    def spread(count: int, among: list[gen.DemoNode]) -> list[str]:
        return [_suffix(rng.choice(among)) for _ in range(count)]

    batch_busy = next(n for n in nodes if n.note == "batch, busy")
    return [
        gen.Workload("shop", "web", "250m", "256Mi", spread(8, busy), pdb={"maxUnavailable": 1}),
        gen.Workload("shop", "api", "200m", "256Mi", spread(4, busy), pdb={"minAvailable": "50%"}),
        gen.Workload("shop", "cart", "100m", "128Mi", spread(len(nearly_empty), nearly_empty)),
        # A PDB that never allows an eviction: its pods leave only at the drain deadline.
        gen.Workload(
            "shop",
            "ledger",
            "100m",
            "128Mi",
            [_suffix(by_role["drifted-stubborn"])] * 2,
            pdb={"minAvailable": 2},
        ),
        # Pods that ignore eviction: the eviction is admitted, the pod stays Terminating its full
        # grace period (a process that does not exit on SIGTERM).
        gen.Workload(
            "shop",
            "stubborn",
            "100m",
            "128Mi",
            [_suffix(by_role["slow-stop"])] * 2,
            pdb={"maxUnavailable": 1},
            grace=600,
        ),
        gen.Workload(
            "ml",
            "trainer",
            "250m",
            "256Mi",
            [_suffix(by_role["do-not-disrupt"])],
            annotations={k.DO_NOT_DISRUPT_ANNOTATION: "true"},
        ),
        gen.Workload(
            "kube-system",
            "coredns",
            "100m",
            "70Mi",
            spread(2, busy),
            pdb={"maxUnavailable": 1},
            priority_class="system-cluster-critical",
        ),
        gen.Workload(
            "batch",
            "queue-worker",
            "500m",
            "512Mi",
            [_suffix(batch_busy)] * 2,
            node_selector={k.NODEPOOL_LABEL: "batch"},
            tolerations=[{"key": "workload", "operator": "Equal", "value": "batch", "effect": "NoSchedule"}],
        ),
    ]


def _tune_nodepools(listing: dict[str, Any], drain_deadline: str, consolidate_after: str) -> None:
    """Chaos timings on the demo's NodePools, and the nodes' drift stamps recomputed to match (a
    template change is a new hash: only the nodes meant to drift keep a stale one)."""
    stamps: dict[str, dict[str, str]] = {}
    for item in listing["items"]:
        if item["kind"] != "NodePool":
            continue
        spec = item["spec"]
        spec["disruption"]["consolidateAfter"] = consolidate_after
        if item["metadata"]["name"] == "default":
            spec["template"]["spec"]["terminationGracePeriod"] = drain_deadline
            spec["disruption"]["budgets"] = [{"nodes": "25%"}]
            spec.pop("limits", None)
        pool = NodePool.model_validate({"metadata": {"name": item["metadata"]["name"]}, "spec": spec})
        stamps[item["metadata"]["name"]] = nodepool_hash_annotations(pool)
        item["metadata"]["annotations"] = {**item["metadata"].get("annotations", {}), **stamps[pool.name]}
    for item in listing["items"]:
        if item["kind"] != "Node":
            continue
        annotations = item["metadata"]["annotations"]
        pool = item["metadata"]["labels"][k.NODEPOOL_LABEL]
        stale = annotations.get("karpflow.io/demo-note", "").startswith("drifted")
        if not stale:
            annotations.update(stamps[pool])
