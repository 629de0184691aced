"""Cost-aware packing of moved pods onto new nodes, a part of the scheduling simulation used when the
caller may launch several nodes (the `max_replacements` extension of multi-node consolidation).

Karpenter fills new NodeClaims pod by pod, largest CPU request first, and lets a claim grow until no
instance type holds more. For one replacement that is the right answer: the cheapest type that holds
the lot is launched. For several it makes lopsided nodes: the first claims fill up with CPU-heavy pods
and end as large general-purpose nodes with memory idle, while the memory-heavy pods come last.

Here the pods that no existing node takes fill new nodes one node at a time:
1. Every pod shape (request vector) has a fair price: on the instance type that suits it best, the
   type's price times the largest share of any resource the pod takes there.
2. For the next node, the instance types that would host what is left most cheaply (at most
   `CANDIDATE_TYPES` per NodePool) are each filled in a dry run. Each step takes the shape whose
   requests best match the room left (their dot product, each resource relative to the type), so
   large pods that fit the shape of the hole go first and CPU-heavy and memory-heavy pods are mixed
   to fill both. The type whose dry run is worth most per dollar wins: fair price of its pods over
   the price of the cheapest type that holds them.
3. That node is filled for real with the same rule, every pod checked by the simulator's claim rules
   (requirements, taints, host ports, topology, limits). The node is not pinned to the type it was
   sized for: its options are every type that holds what it got, so a half-filled last node launches
   small.
Pods no new node takes are returned to the caller for the usual pod-by-pod placement.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from planner.scheduling.state import (
    Effective,
    OpenClaim,
    PreparedPool,
    Probe,
    TypeEntry,
    Vec,
    vec_add,
    vec_fits,
    vec_share,
    vec_sub,
)

if TYPE_CHECKING:
    from planner.scheduling.inputs import SimPod
    from planner.scheduling.results import SimulationResult


class ClaimRules(Protocol):
    """What packing asks of the simulator (planner/scheduling/new_nodes.py): every pod still goes
    through its claim rules."""

    @property
    def pools(self) -> list[PreparedPool]: ...

    def pool_tolerates(self, pool: PreparedPool, eff: Effective) -> bool: ...

    def pool_types(self, pool: PreparedPool, probe: Probe | None = None) -> list[TypeEntry]: ...

    def fair_price(self, vec: Vec) -> float: ...

    def open_claim(
        self, probe: Probe, eff: Effective, pod_key: str, max_new_claims: int | None, pool: PreparedPool
    ) -> OpenClaim | None: ...

    def join_claim(self, probe: Probe, claim: OpenClaim, eff: Effective, pod_key: str) -> bool: ...


# Instance types tried per NodePool for each new node: the ones that host the remaining pods at the
# lowest fractional price. Bounds the dry runs on catalogs with hundreds of types.
CANDIDATE_TYPES = 12

Queue = dict[Vec, list[tuple["SimPod", Effective]]]


def pack_new_nodes(
    sim: ClaimRules,
    probe: Probe,
    items: list[tuple[SimPod, Effective]],
    result: SimulationResult,
    max_new_claims: int | None,
) -> list[SimPod]:
    """Place `items` (pods no existing node takes, in placement order) on new NodeClaims of `probe`.
    Returns the pods it did not place. Raises SimulationAborted past `max_new_claims`."""
    queue: Queue = {}
    rest: list[SimPod] = []
    for pod, eff in items:
        vec = eff.vec
        assert vec is not None  # the caller keeps pods whose requests nothing offers for _place
        if sim.fair_price(vec) == float("inf"):
            rest.append(pod)  # no instance type holds it: the usual placement explains why
        else:
            queue.setdefault(vec, []).append((pod, eff))
    while queue:
        choice = _choose_node(sim, probe, queue)
        if choice is None:
            break
        pool, target = choice
        claim = _open(sim, probe, pool, target, queue, result, max_new_claims, rest)
        if claim is not None:
            _fill(sim, probe, claim, target.alloc, queue, result)
    for pods in queue.values():
        rest.extend(pod for pod, _ in pods)
    return rest


def _match(vec: Vec, room: Vec, alloc: Vec) -> float:
    """How well a request fills the room left on a node of `alloc` (dot product, per-resource shares)."""
    return sum(x * r / (a * a) for x, r, a in zip(vec, room, alloc, strict=True) if x and a)


def _best_shape(shapes: dict[Vec, int], room: Vec, alloc: Vec) -> Vec | None:
    best: tuple[float, Vec] | None = None
    for vec, count in shapes.items():
        if count and vec_fits(vec, room):
            score = _match(vec, room, alloc)
            if best is None or score > best[0]:
                best = (score, vec)
    return best[1] if best is not None else None


def _dry_fill(sim: ClaimRules, shapes: dict[Vec, int], alloc: Vec) -> tuple[float, Vec]:
    """Fill a node of `alloc` from `shapes` (request vector -> count) by resources alone: the fair
    price of what it takes, and what it takes."""
    shapes = dict(shapes)
    room = alloc
    used = tuple(0 for _ in alloc)
    value = 0.0
    while (vec := _best_shape(shapes, room, alloc)) is not None:
        shapes[vec] -= 1
        room = vec_sub(room, vec)
        used = vec_add(used, vec)
        value += sim.fair_price(vec)
    return value, used


def _choose_node(sim: ClaimRules, probe: Probe, queue: Queue) -> tuple[PreparedPool, TypeEntry] | None:
    """The NodePool and instance type to size the next new node for (see the module docstring)."""
    best: tuple[tuple[float, float, str, str], PreparedPool, TypeEntry] | None = None
    for pool in sim.pools:
        # Shapes whose first pod tolerates the pool (the real fill checks every pod).
        shapes = {vec: len(pods) for vec, pods in queue.items() if sim.pool_tolerates(pool, pods[0][1])}
        if not shapes:
            continue
        entries = sim.pool_types(pool, probe)
        total = tuple(
            sum(col) for col in zip(*(tuple(x * n for x in v) for v, n in shapes.items()), strict=True)
        )
        ranked = sorted(entries, key=lambda e: (e.price * vec_share(total, e.alloc), e.name))
        for entry in ranked[:CANDIDATE_TYPES]:
            value, used = _dry_fill(sim, shapes, entry.alloc)
            if value <= 0:
                continue
            price = next((e.price for e in entries if vec_fits(used, e.alloc)), entry.price)
            key = (-value / price, -value, pool.pool.name, entry.name)
            if best is None or key < best[0]:
                best = (key, pool, entry)
    return (best[1], best[2]) if best is not None else None


def _take(queue: Queue, vec: Vec, index: int) -> None:
    pods = queue[vec]
    del pods[index]
    if not pods:
        del queue[vec]


def _open(
    sim: ClaimRules,
    probe: Probe,
    pool: PreparedPool,
    target: TypeEntry,
    queue: Queue,
    result: SimulationResult,
    max_new_claims: int | None,
    rest: list[SimPod],
) -> OpenClaim | None:
    """Open a claim in `pool` with the pod that best fills an empty `target`. A pod that cannot open
    one there goes to `rest` (so every call makes progress); None when none could."""
    shapes = {vec: len(pods) for vec, pods in queue.items()}
    while (vec := _best_shape(shapes, target.alloc, target.alloc)) is not None:
        pod, eff = queue[vec][0]
        _take(queue, vec, 0)
        shapes[vec] -= 1
        claim = sim.open_claim(probe, eff, pod.key, max_new_claims, pool)
        if claim is not None:
            result.placements[pod.key] = claim.name
            return claim
        rest.append(pod)
    return None


def _fill(
    sim: ClaimRules, probe: Probe, claim: OpenClaim, alloc: Vec, queue: Queue, result: SimulationResult
) -> None:
    """Add pods to `claim` while they fit `alloc`, best-matching shape first, each checked by the claim
    rules. A shape none of whose pods may join is not offered again to this claim."""
    refused: set[Vec] = set()
    while True:
        room = vec_sub(alloc, claim.used)
        shapes = {vec: len(pods) for vec, pods in queue.items() if vec not in refused}
        vec = _best_shape(shapes, room, alloc)
        if vec is None:
            return
        tried: set[int] = set()
        for index, (pod, eff) in enumerate(queue[vec]):
            if id(eff) in tried:
                continue
            if sim.join_claim(probe, claim, eff, pod.key):
                result.placements[pod.key] = claim.name
                _take(queue, vec, index)
                break
            tried.add(id(eff))
        else:
            refused.add(vec)
