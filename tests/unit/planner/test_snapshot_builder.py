"""An incrementally maintained snapshot equals one built from scratch (planner/snapshot_builder.py).

The reference is what the worker built every pass before: `Snapshot.from_objects` over the informer's
objects, in its order, with held nodes tainted. The model of the informer here applies events as
cluster/informer.py does (a key set in place or appended, popped on delete, a listing replacing all).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import random
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from api.constants import DISRUPTED_TAINT_KEY, DO_NOT_DISRUPT_ANNOTATION
from planner.catalog import bundled_catalog
from planner.plan import plan
from planner.snapshot import Node, Snapshot
from planner.snapshot_builder import ADDED, DELETED, MODIFIED, SnapshotBuilder, object_key
from sim.cluster_builder import DEFAULT_NOW, NODECLAIM_SPEC, ClusterSpec, generate_cluster

# The informer's kinds, in its order (cluster/informer.py RESOURCES).
KINDS = (
    "Node",
    "Pod",
    "PodDisruptionBudget",
    "DaemonSet",
    "NodePool",
    "EC2NodeClass",
    "NodeClaim",
    "Provisioner",
    "AWSNodeTemplate",
    "MaintenanceWindow",
    "NodeDisruptionBudget",
    "NodeOverlay",
)


# -- a comparable form of a snapshot -----------------------------------------------------------------


def plain(value: Any, depth: int = 0) -> Any:
    """Every field of every object, recursively, as plain data (objects compared by content)."""
    assert depth < 40, "unexpectedly deep object graph"
    if isinstance(value, Node):
        # pods_source is the builder's own token for its list of the node's pods (None from scratch).
        skipped = ("pods", "pods_source", "nodeclaim")
        fields = {s: getattr(value, s) for s in Node.__slots__ if s not in skipped}
        return {
            **{k: plain(v, depth + 1) for k, v in fields.items()},
            "pods": [p.key for p in value.pods],
            "nodeclaim": value.nodeclaim.name if value.nodeclaim is not None else None,
        }
    if isinstance(value, BaseModel):
        return value.model_dump()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (
            type(value).__name__,
            {f.name: plain(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value)},
        )
    if isinstance(value, dict):
        return [(plain(k, depth + 1), plain(v, depth + 1)) for k, v in value.items()]
    if isinstance(value, list | tuple):
        return [plain(v, depth + 1) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((plain(v, depth + 1) for v in value), key=repr)
    slots = [s for cls in type(value).__mro__ for s in getattr(cls, "__slots__", ())]
    if slots and not isinstance(value, str | int | float | bool | datetime | timedelta):
        return (type(value).__name__, {s: plain(getattr(value, s, None), depth + 1) for s in slots})
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return (type(value).__name__, {k: plain(v, depth + 1) for k, v in vars(value).items()})
    return value


def described(snapshot: Snapshot) -> dict[str, Any]:
    return {
        "now": snapshot.now,
        "sources": snapshot.sources,
        "nodes": plain(snapshot.nodes),
        "pods": plain(snapshot.pods),
        "pdbs": plain(snapshot.pdbs),
        "pdbs_for": [[pdb.key for pdb in snapshot.pdbs_for(p)] for p in snapshot.pods],
        "nodepools": plain(snapshot.nodepools),
        "nodeclasses": plain(snapshot.nodeclasses),
        "daemonsets": plain(snapshot.daemonsets),
        "nodeclaims": plain(snapshot.nodeclaims),
        "instances": plain(snapshot.instances),
        "problems": snapshot.problems,
        "budget_errors": plain(snapshot.budget_errors),
        "nodeclass_not_ready": plain(snapshot.nodeclass_not_ready),
        "maintenance_windows": plain(snapshot.maintenance_windows),
        "node_disruption_budgets": plain(snapshot.node_disruption_budgets),
        "node_overlays": plain(snapshot.node_overlays),
    }


# -- the informer, modelled --------------------------------------------------------------------------


class Informers:
    """What the informers hold, fed to a SnapshotBuilder event by event."""

    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self.items: dict[str, dict[str, dict[str, Any]]] = {kind: {} for kind in KINDS}
        self.builder = SnapshotBuilder(KINDS)
        self.version = itertools.count(1000)
        by_kind: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
        for obj in objects:
            if obj.get("kind") in by_kind:
                obj["metadata"].setdefault("resourceVersion", str(next(self.version)))
                by_kind[obj["kind"]].append(obj)
        for kind, listed in by_kind.items():
            self.relist(kind, listed)

    def relist(self, kind: str, listed: list[dict[str, Any]]) -> None:
        self.items[kind] = {object_key(o): o for o in listed}
        self.builder.replace(kind, listed)

    def event(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        if event == DELETED:
            self.items[kind].pop(object_key(obj), None)
        else:
            obj["metadata"]["resourceVersion"] = str(next(self.version))
            self.items[kind][object_key(obj)] = obj
        self.builder.apply(kind, event, obj)

    def objects(self) -> list[dict[str, Any]]:
        return [obj for kind in KINDS for obj in self.items[kind].values()]


def from_scratch(informers: Informers, now: datetime, instances: list[dict], held: set[str]) -> Snapshot:
    """What the planning activity built every pass before the builder."""
    objects = []
    for obj in informers.objects():
        taints = (obj.get("spec") or {}).get("taints") or []
        if (
            obj["kind"] == "Node"
            and obj["metadata"]["name"] in held
            and not any(t.get("key") == DISRUPTED_TAINT_KEY for t in taints)
        ):
            obj = {
                **obj,
                "spec": {
                    **obj.get("spec", {}),
                    "taints": [*taints, {"key": DISRUPTED_TAINT_KEY, "effect": "NoSchedule"}],
                },
            }
        objects.append(obj)
    return Snapshot.from_objects(objects, now=now, instances=instances)


def cluster(seed: int, nodes: int = 8, pods: int = 60) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    objects, instances = copy.deepcopy(_generated(seed, nodes, pods))
    return objects, instances


@functools.cache
def _generated(seed: int, nodes: int, pods: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    built = generate_cluster(ClusterSpec(nodes=nodes, pods=pods, pools=3, seed=seed))
    objects = built.objects
    for index, node in enumerate(o for o in list(objects) if o["kind"] == "Node"):
        if index % 3 == 0:  # a NodeClaim for some nodes, as Karpenter keeps one per node
            objects.append(
                {
                    "apiVersion": "karpenter.sh/v1",
                    "kind": "NodeClaim",
                    "metadata": {"name": f"claim-{index}", "labels": dict(node["metadata"]["labels"])},
                    "spec": {**NODECLAIM_SPEC, "expireAfter": "720h" if index % 2 else "bogus"},
                    "status": {"nodeName": node["metadata"]["name"]},
                }
            )
    for name, spec in (
        ("discount", {"requirements": [], "priceAdjustment": "-10%", "weight": 10}),
        ("broken", {"requirements": [{"key": "karpenter.sh/nope", "operator": "In"}], "price": "+1"}),
    ):  # Karpenter's NodeOverlays, one it would refuse
        objects.append(
            {
                "apiVersion": "karpenter.sh/v1alpha1",
                "kind": "NodeOverlay",
                "metadata": {"name": name},
                "spec": spec,
            }
        )
    return objects, built.instances


# -- random changes, as a live cluster makes them ----------------------------------------------------


def change(informers: Informers, rng: random.Random, serial: int) -> None:
    """One random change: an edit, a new object, a deletion, or a re-list of a kind."""
    kind = rng.choice(
        ["Pod"] * 6 + ["Node"] * 3 + ["PodDisruptionBudget", "NodePool", "NodeClaim", "NodeOverlay", "relist"]
    )
    if kind == "relist":
        relisted = rng.choice(KINDS)
        listed = list(informers.items[relisted].values())
        rng.shuffle(listed)
        # A listing returns new dicts; some objects changed meanwhile (a new resourceVersion).
        fresh = []
        for obj in listed:
            obj = copy.deepcopy(obj)
            if rng.random() < 0.2:
                obj["metadata"]["resourceVersion"] = str(next(informers.version))
                obj["metadata"].setdefault("annotations", {})["relisted"] = str(serial)
            fresh.append(obj)
        informers.relist(relisted, fresh)
        return
    current = list(informers.items[kind].values())
    if not current:
        return
    obj = copy.deepcopy(rng.choice(current))
    meta = obj["metadata"]
    what = rng.random()
    if what < 0.15:
        informers.event(kind, DELETED, obj)
        return
    if what < 0.3:  # a new object like this one
        meta["name"] = f"{meta['name']}-x{serial}"
        meta["uid"] = f"uid-{serial}"
        informers.event(kind, ADDED, obj)
        return
    edit = rng.choice(["label", "annotation", "taint", "node", "phase", "deleting", "malformed", "budget"])
    if edit == "label":
        labels = meta.get("labels") if isinstance(meta.get("labels"), dict) else {}
        meta["labels"] = {**labels, f"l{serial % 3}": str(serial)}
    elif edit == "annotation":
        value = rng.choice(["true", "5m", "not-a-duration"])
        meta.setdefault("annotations", {})[DO_NOT_DISRUPT_ANNOTATION] = value
    elif edit == "taint" and kind == "Node":
        taints = obj.setdefault("spec", {}).setdefault("taints", [])
        if taints and rng.random() < 0.5:
            taints.pop()
        else:
            taints.append({"key": rng.choice([DISRUPTED_TAINT_KEY, "team"]), "effect": "NoSchedule"})
    elif edit == "node" and kind == "Pod":
        names = [*informers.items["Node"].values()]
        obj["spec"]["nodeName"] = (
            rng.choice(names)["metadata"]["name"] if names and rng.random() < 0.8 else None
        )
    elif edit == "phase" and kind == "Pod":
        obj.setdefault("status", {})["phase"] = rng.choice(["Succeeded", "Failed", "Running"])
    elif edit == "deleting":
        meta["deletionTimestamp"] = "2026-11-22T09:59:00Z"
    elif edit == "malformed":
        meta["labels"] = ["not", "a", "map"]
    elif edit == "budget" and kind == "NodePool":
        obj["spec"].setdefault("disruption", {})["budgets"] = [{"nodes": rng.choice(["150%", "3", "0"])}]
    elif edit == "budget" and kind == "PodDisruptionBudget":
        obj["spec"] = {k: v for k, v in obj["spec"].items() if k not in ("minAvailable", "maxUnavailable")}
        obj["spec"]["maxUnavailable"] = rng.choice([0, 1, "50%"])
        obj.pop("status", None)
    informers.event(kind, MODIFIED, obj)


def changed_in_steps(informers: Informers, rng: random.Random, steps: list[int]) -> Iterator[int]:
    """Make each step's number of random changes, then yield the serial of the last change so far (the
    caller builds or plans there, and may draw from `rng` before the next step)."""
    serial = 0
    for count in steps:
        for _ in range(count):
            serial += 1
            change(informers, rng, serial)
        yield serial


# -- the properties ----------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), steps=st.lists(st.integers(1, 12), min_size=1, max_size=6))
def test_an_incremental_snapshot_equals_one_built_from_scratch_after_random_events(seed, steps):
    objects, instances = cluster(seed % 10)
    informers = Informers(objects)
    rng = random.Random(seed)
    for serial in changed_in_steps(informers, rng, steps):
        nodes = list(informers.items["Node"])
        held = {key.lstrip("/") for key in rng.sample(nodes, min(len(nodes), rng.randint(0, 3)))} | {"gone"}
        now = DEFAULT_NOW + timedelta(minutes=serial)
        shown = rng.sample(instances, rng.randint(0, len(instances)))
        built = informers.builder.snapshot(now, shown, held)
        assert described(built) == described(from_scratch(informers, now, shown, held))


def test_only_changed_objects_are_parsed_again():
    objects, instances = cluster(3, nodes=10, pods=100)
    informers = Informers(objects)
    informers.builder.snapshot(DEFAULT_NOW, instances)
    first = informers.builder.parsed
    assert first == len(informers.objects())
    pod = copy.deepcopy(next(iter(informers.items["Pod"].values())))
    pod["metadata"].setdefault("labels", {})["changed"] = "yes"
    informers.event("Pod", MODIFIED, pod)
    informers.event("Pod", MODIFIED, copy.deepcopy(pod))  # twice before a pass: parsed once
    informers.builder.snapshot(DEFAULT_NOW, instances)
    assert informers.builder.parsed == first + 1
    # A listing that returns the same versions parses nothing again.
    informers.relist("Pod", [copy.deepcopy(o) for o in informers.items["Pod"].values()])
    informers.builder.snapshot(DEFAULT_NOW, instances)
    assert informers.builder.parsed == first + 1


def test_a_snapshot_in_use_does_not_change_when_the_next_is_built():
    objects, instances = cluster(5)
    informers = Informers(objects)
    first = informers.builder.snapshot(DEFAULT_NOW, instances, held=set())
    before = described(first)
    node = copy.deepcopy(next(iter(informers.items["Node"].values())))
    pods = [
        p for p in informers.items["Pod"].values() if p["spec"].get("nodeName") == node["metadata"]["name"]
    ]
    for pod in pods:
        informers.event("Pod", DELETED, pod)
    informers.builder.snapshot(DEFAULT_NOW, instances, held={node["metadata"]["name"]})
    assert described(first) == before


def test_the_plan_is_the_same_on_either_snapshot():
    objects, instances = cluster(11, nodes=30, pods=300)
    informers = Informers(objects)
    rng = random.Random(11)
    catalog = bundled_catalog("us-west-2")
    for serial in range(1, 60):
        change(informers, rng, serial)
    held = {next(iter(informers.items["Node"])).lstrip("/")}
    built = informers.builder.snapshot(DEFAULT_NOW, instances, held)
    scratch = from_scratch(informers, DEFAULT_NOW, instances, held)
    assert plan(built, catalog).model_dump() == plan(scratch, catalog).model_dump()
