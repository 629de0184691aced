"""The fleet problem: what the solver decides on, read off the scheduling simulation's prepared view.

- **Pod groups**: the pods that would move if their node went, grouped by request vector and by what
  constrains where they may go (tolerations and required node terms: the simulator's static key).
- **Rooms**: existing nodes that may take pods, with their free room. Those that the method may
  remove (the candidates of Optimal pools) carry their price and their pods per group; the others
  (other pools, nodes not consolidatable yet, blocked ones) are fixed and their room is free.
  Rooms that admit the same groups form a *room class*: the solver reasons about a class's total
  room, the simulation then checks that the pods really fit node by node.
- **Launch options**: what a new node may be, one per (NodePool, instance type, capacity type) and
  set of zones of equal price, with its allocatable net of the DaemonSets that would run on it and
  the groups it admits (NodePool taints and requirements merged with each group's node terms, as the
  simulation merges them for a new NodeClaim). Options another option beats on price and room are
  dropped.

Preferences are relaxed (required rules only), and topology spread, pod (anti-)affinity and host
ports are not modelled here: the simulation, which is the referee, enforces them on every move.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from api.constants import CAPACITY_TYPE_LABEL, ZONE_LABEL
from planner.limits import PoolLimit, pool_limit_rows
from planner.model import Candidate, PlanContext
from planner.scheduling.adapter import SnapshotSimulation
from planner.scheduling.requirements import Reqs
from planner.scheduling.state import Effective, PreparedPool, StaticKey, Vec
from planner.snapshot import Pod

# Resources every node has; others enter the model only when some moving pod asks for them.
_ALWAYS = ("cpu", "memory", "pods")


@dataclass(slots=True)
class PodGroup:
    index: int
    vec: Vec  # requests on the problem's dimensions
    eff: Effective  # a member's required view (all members share its static key)
    per_node: dict[str, list[Pod]] = field(default_factory=dict)  # movable node -> its pods of the group

    @property
    def count(self) -> int:
        return sum(len(p) for p in self.per_node.values())


@dataclass(slots=True)
class Room:
    name: str
    free: Vec  # allocatable minus what its bound pods request, on the problem's dimensions
    admits: frozenset[int]  # groups that may land here
    candidate: Candidate | None = None  # set when the method may remove the node
    pods: dict[int, int] = field(default_factory=dict)  # movable: its moving pods per group

    @property
    def movable(self) -> bool:
        return self.candidate is not None

    @property
    def price(self) -> float:
        return (self.candidate.price or 0.0) if self.candidate is not None else 0.0


@dataclass(slots=True)
class LaunchOption:
    pool: str
    instance_type: str
    capacity_type: str
    zones: tuple[str, ...]  # zones of equal (the lowest) price for this type and capacity type
    price: float
    alloc: Vec  # allocatable net of the pool's DaemonSets, on the problem's dimensions
    admits: frozenset[int]

    @property
    def label(self) -> str:
        return f"{self.pool}/{self.instance_type}/{self.capacity_type}"


@dataclass
class FleetProblem:
    dims: list[int]  # indices into the simulator's vectors
    dim_names: list[str]
    groups: list[PodGroup]
    rooms: list[Room]
    options: list[LaunchOption]
    prepared: SnapshotSimulation
    # NodePool spec.limits over the kept nodes and the launches (planner/limits.py), Karpenter's rule
    limits: list[PoolLimit] = field(default_factory=list)

    @property
    def movable(self) -> list[Room]:
        return [r for r in self.rooms if r.movable]

    @property
    def current_cost(self) -> float:
        """What the movable nodes cost per hour now."""
        return sum(r.price for r in self.movable)

    def demand(self) -> Vec:
        """Total requests of the pods on the movable nodes that could move (staying pods included)."""
        total = [0] * len(self.dims)
        for g in self.groups:
            for i, v in enumerate(g.vec):
                total[i] += v * g.count
        return tuple(total)


def build_problem(
    ctx: PlanContext, prepared: SnapshotSimulation, movable: Sequence[Candidate]
) -> FleetProblem:
    sim = prepared.simulator
    gone = set(ctx.marked_for_deletion) | set(prepared.deleting)
    by_name = {c.name: c for c in movable}

    # Pod groups: the moving pods of every movable node.
    raw: list[tuple[str, Pod, Effective, Vec]] = []
    extra_dims: set[int] = set()
    for candidate in movable:
        for pod in prepared.pods_of([candidate.name]):
            eff = sim.required_view(prepared.sim_pod(pod).constraints)
            if eff.vec is None:
                continue
            raw.append((candidate.name, pod, eff, eff.vec))
            extra_dims.update(i for i, v in enumerate(eff.vec) if v)
    names = sim.resource_names
    dims = sorted({names.index(n) for n in _ALWAYS if n in names} | extra_dims)
    groups: list[PodGroup] = []
    index: dict[tuple[Vec, StaticKey], PodGroup] = {}
    for node_name, pod, eff, vec in raw:
        small = tuple(vec[i] for i in dims)
        key = (small, eff.static_key)
        group = index.get(key)
        if group is None:
            group = index[key] = PodGroup(len(groups), small, eff)
            groups.append(group)
        group.per_node.setdefault(node_name, []).append(pod)

    # Rooms: every initialized node staying in the simulation.
    rooms: list[Room] = []
    for node in sim.nodes:
        if node.name in gone or not node.initialized:
            continue
        admits = frozenset(g.index for g in groups if sim.node_admits(g.eff, node))
        movable_node = by_name.get(node.name)
        if movable_node is None and not admits:
            continue
        room = Room(node.name, tuple(node.free[i] for i in dims), admits, movable_node)
        if movable_node is not None:
            room.pods = {g.index: len(g.per_node[node.name]) for g in groups if node.name in g.per_node}
            # Its own pods may always stay where they are.
            room.admits = admits | frozenset(room.pods)
        rooms.append(room)

    options = _launch_options(prepared, groups, dims)
    limits = pool_limit_rows(ctx, movable, [(o.pool, o.instance_type) for o in options])
    return FleetProblem(dims, [names[i] for i in dims], groups, rooms, options, prepared, limits)


def _launch_options(
    prepared: SnapshotSimulation, groups: list[PodGroup], dims: list[int]
) -> list[LaunchOption]:
    sim = prepared.simulator
    # Per pool and group: the requirement sets a new node would have for the group's pods.
    merged: dict[tuple[str, int], list[Reqs]] = {}
    for pool in sim.pools:
        for g in groups:
            merged[(pool.pool.name, g.index)] = sim.pool_requirements(pool, g.eff)
    allowed_types: dict[tuple[str, int], list[tuple[frozenset[str], Reqs]]] = {}
    for (pool_name, gi), reqs_list in merged.items():
        pool = _pool(sim.pools, pool_name)
        allowed_types[(pool_name, gi)] = [
            (frozenset(e.name for e in sim.types_under(pool, reqs)), reqs) for reqs in reqs_list
        ]
    by_key: dict[tuple[str, str, str, frozenset[int]], LaunchOption] = {}
    for pool in sim.pools:
        name = pool.pool.name
        for entry in sim.pool_types(pool):
            kind = sim.pool_instance_type(name, entry.name)
            # Per (capacity type, zone): the offering's price and the groups it admits.
            for offering in kind.offerings:
                if not offering.available or offering.capacity_type not in entry.capacity_types:
                    continue
                if offering.zone not in entry.zones:
                    continue
                admits = frozenset(
                    g.index
                    for g in groups
                    if any(
                        entry.name in types and _allows(reqs, offering.zone, offering.capacity_type)
                        for types, reqs in allowed_types[(name, g.index)]
                    )
                )
                if not admits:
                    continue
                key = (name, entry.name, offering.capacity_type, admits)
                alloc = tuple(entry.alloc[i] for i in dims)
                best = by_key.get(key)
                if best is None or offering.price < best.price:
                    by_key[key] = LaunchOption(
                        name,
                        entry.name,
                        offering.capacity_type,
                        (offering.zone,),
                        offering.price,
                        alloc,
                        admits,
                    )
                elif offering.price == best.price and offering.zone not in best.zones:
                    best.zones = tuple(sorted((*best.zones, offering.zone)))
    return _undominated(list(by_key.values()))


def _pool(pools: list[PreparedPool], name: str) -> PreparedPool:
    return next(p for p in pools if p.pool.name == name)


def _allows(reqs: Reqs, zone: str, capacity_type: str) -> bool:
    for r in reqs:
        if r.key == ZONE_LABEL and not r.has(zone):
            return False
        if r.key == CAPACITY_TYPE_LABEL and not r.has(capacity_type):
            return False
    return True


def _undominated(options: list[LaunchOption]) -> list[LaunchOption]:
    """Drop an option when another admits at least its groups, holds at least as much of everything
    and costs no more (ties keep the first by name, so the answer does not depend on input order)."""
    options.sort(key=lambda o: (o.price, o.pool, o.instance_type, o.capacity_type, o.zones))
    kept: list[LaunchOption] = []
    for o in options:
        if any(
            k.price <= o.price
            and k.admits >= o.admits
            and all(a >= b for a, b in zip(k.alloc, o.alloc, strict=True))
            for k in kept
        ):
            continue
        kept.append(o)
    return kept


__all__ = ["FleetProblem", "LaunchOption", "PodGroup", "Room", "build_problem"]
