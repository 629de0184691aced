"""NodeOverlay (Karpenter v1.7, `karpenter.sh/v1alpha1`): each NodePool's view of the catalog, its
instance types' offering prices and extended capacity changed as the cluster's NodeOverlays say.

Karpenter's rules (pkg/controllers/nodeoverlay/controller.go and store.go, written from them):
- Behind the `NodeOverlay` feature gate, off by default (pkg/operator/options/options.go);
  karpflow's is the worker's `--node-overlay` (`PlanOptions.node_overlay`, `karpflow plan
  --node-overlay`). Off, the overlays are read and ignored.
- Overlays are taken by weight, highest first, and among equal weights the name later in the
  alphabet first (v1alpha1 `OrderByWeight`). One that fails runtime validation is skipped.
- Per NodePool and instance type, an overlay applies when its requirements are compatible with
  the type's requirements (its labels, the zones and capacity types of its offerings, the region),
  `karpenter.sh/nodepool` = the pool and the pool's template labels (`getOverlaidOfferings`: keys the
  type lacks are refused unless the operator is NotIn or DoesNotExist), and then to those of its
  offerings whose zone and capacity type the requirements allow.
- Price: the first overlay to reach an offering sets it (a higher weight wins). `price` is the new
  price; `priceAdjustment` adds an amount or a percentage, never below 0 (cloudprovider `AdjustedPrice`).
- Capacity: extended resources are added to the type, the first overlay to name a resource wins.
- Conflicts: an overlay of the same weight as the last one that changed an offering's price (or,
  for capacity, one of the resources of the last capacity overlay on the type) conflicts; a
  conflicting overlay is not applied anywhere (all NodePools or none), and reported.

What differs: Karpenter writes a `ValidationSucceeded` condition on each overlay; karpflow never
writes Karpenter's objects and reports a skipped overlay as a problem of the plan instead. A skipped
overlay (it fails the CRD's rules or Karpenter's runtime validation, or it conflicts) applies
nothing, as in Karpenter, and the others still apply; but where Karpenter consolidates on (it fails
open by design: designs/node-overlay.md "Misconfiguration"), karpflow fails closed: the NodePools
the overlay may reach (every pool, for one it cannot read) move no pods until it is fixed
(`OverlayResult.held`, read by planner/candidates.py `consolidation_block`). Empty nodes still go,
and drift still replaces: neither is decided on prices.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from api import constants as k
from api.node_overlay import NodeOverlay, ReadOverlay
from api.nodepool import NodePool
from planner.catalog import Catalog, InstanceType, Offering
from planner.resources import Resources
from planner.scheduling.requirements import Req, freeze

if TYPE_CHECKING:
    from planner.snapshot import Snapshot

_ZONE = "topology.kubernetes.io/zone"
_REGION = "topology.kubernetes.io/region"
_CAPACITY_TYPE = "karpenter.sh/capacity-type"


def adjusted_price(price: float, change: str) -> float:
    """Karpenter's cloudprovider.AdjustedPrice: an unsigned value is the new price; a signed one is
    added, as an amount or as a percentage of the price; the result is never below 0."""
    if not change:
        return price
    if not change.startswith(("+", "-")):
        return float(change)
    percent = change.endswith("%")
    adjusted = price * (1 + float(change[:-1]) / 100) if percent else price + float(change)
    return max(adjusted, 0.0)


@dataclass(frozen=True)
class OverlaidInstanceType(InstanceType):
    """An instance type with the extended resources NodeOverlays add to its capacity (and so to its
    allocatable: Karpenter's overhead never reserves extended resources)."""

    extended_capacity: tuple[tuple[str, int], ...] = ()

    @cached_property
    def _plain(self) -> InstanceType:
        return InstanceType(**_fields(self))

    @cached_property
    def capacity_resources(self) -> Resources:
        return _with_extended(self._plain.capacity_resources, self.extended_capacity)

    @cached_property
    def allocatable_resources(self) -> Resources:
        return _with_extended(self._plain.allocatable_resources, self.extended_capacity)


def _fields(it: InstanceType) -> dict[str, Any]:
    """The fields of a plain InstanceType, read off `it`."""
    return {name: getattr(it, name) for name in _FIELD_NAMES}


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(InstanceType))


def _with_extended(base: Resources, extended: Iterable[tuple[str, int]]) -> Resources:
    merged = dict(base.extended)
    merged.update(extended)
    return Resources(base.cpu, base.memory, base.pods, base.ephemeral_storage, merged)


# --- Karpenter's store: what each overlay changes, per NodePool and instance type -----------------


@dataclass
class _PriceUpdate:
    change: str
    overlay: str  # the overlay whose change stands
    lowest_weight: int
    lowest_overlay: str  # the lightest overlay that reached the offering since: conflicts are with it


@dataclass
class _TypeUpdate:
    prices: dict[int, _PriceUpdate] = field(default_factory=dict)  # offering index -> update
    capacity: dict[str, int] = field(default_factory=dict)
    capacity_by: dict[str, str] = field(default_factory=dict)  # resource -> overlay
    capacity_lowest_weight: int = 0
    capacity_lowest_resources: frozenset[str] = frozenset()
    capacity_lowest_overlay: str = ""


@dataclass(frozen=True)
class _Change:
    """What one overlay changes, read once."""

    name: str
    weight: int
    price: str | None
    capacity: Mapping[str, int]
    resources: frozenset[str]

    @classmethod
    def of(cls, overlay: NodeOverlay) -> _Change:
        units = overlay.spec.capacity_units()
        return cls(overlay.name, overlay.weight, overlay.spec.price_change, units, frozenset(units))


@dataclass
class OverlayResult:
    """Each NodePool's overlaid catalog (only pools an overlay changed), what each applied overlay
    changed (for `karpflow plan`), and the overlays that were not applied, with why."""

    views: dict[str, Catalog] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # NodePool -> why its consolidation waits: an overlay that may reach it is not applied (fails
    # closed: karpflow does not move pods on prices the user meant to be otherwise).
    held: dict[str, str] = field(default_factory=dict)
    # (pool, instance type) -> the type as the catalog has it, and its offerings' price updates.
    prices: dict[tuple[str, str], tuple[InstanceType, Mapping[int, _PriceUpdate]]] = field(
        default_factory=dict
    )

    def priced_by(self, pool: str, type_name: str, zone: str, capacity_type: str) -> str | None:
        """The overlay that set this offering's price in this pool (None: no overlay did)."""
        known = self.prices.get((pool, type_name))
        if known is None:
            return None
        it, updates = known
        for index, offering in enumerate(it.offerings):
            if offering.zone == zone and offering.capacity_type == capacity_type and index in updates:
                return updates[index].overlay
        return None


def ordered(overlays: Iterable[NodeOverlay]) -> list[NodeOverlay]:
    """Karpenter's OrderByWeight: the highest weight first; equal weights, the later name first."""
    return sorted(overlays, key=lambda o: (o.weight, o.name), reverse=True)


def _requirements(overlay: NodeOverlay) -> tuple[Req, ...]:
    return freeze(Req.of(r.key, r.operator, r.values) for r in overlay.spec.requirements)


class _Matcher:
    """The requirements an overlay is compared with: each type's values, built once; each pool's
    labels."""

    def __init__(self, catalog: Catalog, pools: Sequence[NodePool]) -> None:
        self.region = catalog.region
        self.pool_labels = {
            p.name: {k.NODEPOOL_LABEL: p.name, **p.spec.template.metadata.labels} for p in pools
        }
        self._types: dict[str, dict[str, frozenset[str]]] = {}

    def type_values(self, it: InstanceType) -> dict[str, frozenset[str]]:
        known = self._types.get(it.name)
        if known is None:
            known = {key: frozenset((value,)) for key, value in it.labels.items()}
            known[_ZONE] = frozenset(o.zone for o in it.offerings)
            known[_CAPACITY_TYPE] = frozenset(o.capacity_type for o in it.offerings)
            if self.region:
                known[_REGION] = frozenset((self.region,))
            self._types[it.name] = known
        return known

    def reached(
        self, catalog: Catalog, pools: Sequence[NodePool], reqs: Sequence[Req]
    ) -> list[tuple[str, InstanceType, tuple[int, ...]]]:
        """Karpenter's getOverlaidOfferings for every pool and type: (pool, type, the indexes of the
        offerings the overlay reaches there). Pools whose labels look the same to the overlay (most:
        it names none of them) are matched once."""
        groups: dict[tuple[tuple[str, str | None], ...], list[str]] = {}
        for pool in pools:
            labels = self.pool_labels[pool.name]
            groups.setdefault(tuple((r.key, labels.get(r.key)) for r in reqs), []).append(pool.name)
        out: list[tuple[str, InstanceType, tuple[int, ...]]] = []
        for seen, names in groups.items():
            pool_values = dict(seen)
            matches = [(it, found) for it in catalog if (found := self._offerings(it, reqs, pool_values))]
            out.extend((name, it, found) for name in names for it, found in matches)
        return out

    def _offerings(
        self, it: InstanceType, reqs: Sequence[Req], pool: Mapping[str, str | None]
    ) -> tuple[int, ...]:
        type_values = self.type_values(it)
        for req in reqs:
            values = type_values.get(req.key)
            own = pool.get(req.key)
            if own is not None:
                values = frozenset((own,)) if values is None else values & {own}
            if values is None:
                if not req.allow_absent:  # a key the type lacks: only NotIn / DoesNotExist pass
                    return ()
                continue
            # The type's side is a set of values (In): they intersect when one of them is allowed.
            if not any(req.has(v) for v in values):
                return ()
        by_key = {r.key: r for r in reqs}
        zone, capacity_type = by_key.get(_ZONE), by_key.get(_CAPACITY_TYPE)
        return tuple(
            index
            for index, offering in enumerate(it.offerings)
            if (zone is None or zone.has(offering.zone))
            and (capacity_type is None or capacity_type.has(offering.capacity_type))
        )


def apply_node_overlays(
    catalog: Catalog, overlays: Iterable[ReadOverlay], nodepools: Sequence[NodePool]
) -> OverlayResult:
    """The overlays applied as Karpenter's nodeoverlay controller applies them (module docstring)."""
    result = OverlayResult()
    readable: list[NodeOverlay] = []
    for read in sorted(overlays, key=lambda r: r.name):
        if read.overlay is None:
            result.problems.append(
                f"NodeOverlay {read.name}: {'; '.join(read.problems)} (not applied, as Karpenter skips it; "
                "consolidation waits in every NodePool until it is fixed)"
            )
            for nodepool in nodepools:  # which pools it meant is unknown: all of them
                result.held.setdefault(nodepool.name, _hold(read.name, "it is invalid"))
        else:
            readable.append(read.overlay)
    if not readable or not nodepools:
        return result
    matcher = _Matcher(catalog, nodepools)
    store: dict[str, dict[str, _TypeUpdate]] = {}
    for overlay in ordered(readable):
        reqs, change = _requirements(overlay), _Change.of(overlay)
        reached = matcher.reached(catalog, nodepools, reqs)
        conflict = next(
            (
                other
                for pool, it, offerings in reached
                if (other := _conflict(store, pool, it.name, offerings, change))
            ),
            None,
        )
        if conflict is not None:
            result.problems.append(
                f"NodeOverlay {overlay.name}: conflicts with NodeOverlay {conflict} of the same weight "
                f"({overlay.weight}) on the same offerings or resources (not applied, as Karpenter does; "
                "consolidation waits in the NodePools it reaches until it is fixed)"
            )
            why = f"it conflicts with NodeOverlay {conflict}"
            for name in sorted({pool_name for pool_name, _, _ in reached}):
                result.held.setdefault(name, _hold(overlay.name, why))
            continue
        for pool_name, it, offerings in reached:
            _store(store.setdefault(pool_name, {}).setdefault(it.name, _TypeUpdate()), offerings, change)
    _build_views(catalog, store, result)
    return result


def _hold(overlay: str, why: str) -> str:
    return (
        f"NodeOverlay {overlay} is not applied ({why}): consolidation waits, since prices decide it "
        "(fails closed)"
    )


def _conflict(
    store: Mapping[str, Mapping[str, _TypeUpdate]],
    pool: str,
    type_name: str,
    offerings: Sequence[int],
    overlay: _Change,
) -> str | None:
    """The overlay this one conflicts with on this pool's type (store.go isOfferingUpdateConflicting,
    isCapacityUpdateConflicting: overlays come in descending weight, so only an equal weight can)."""
    update = store.get(pool, {}).get(type_name)
    if update is None:
        return None
    if overlay.price is not None:
        for index in offerings:
            known = update.prices.get(index)
            if known is not None and known.lowest_weight == overlay.weight:
                return known.lowest_overlay
    if (
        overlay.resources
        and update.capacity_lowest_weight == overlay.weight
        and not overlay.resources.isdisjoint(update.capacity_lowest_resources)
    ):
        return update.capacity_lowest_overlay
    return None


def _store(update: _TypeUpdate, offerings: Sequence[int], overlay: _Change) -> None:
    """store.go updateInstanceTypeOffering and updateInstanceTypeCapacity: an earlier (heavier)
    overlay's value stays; the weight it is compared with next drops to this overlay's."""
    change = overlay.price
    if change is not None:
        for index in offerings:
            known = update.prices.get(index)
            if known is not None:
                known.lowest_weight, known.lowest_overlay = overlay.weight, overlay.name
            else:
                update.prices[index] = _PriceUpdate(change, overlay.name, overlay.weight, overlay.name)
    if overlay.capacity:
        for name, units in overlay.capacity.items():
            if name not in update.capacity:
                update.capacity[name] = units
                update.capacity_by[name] = overlay.name
        update.capacity_lowest_resources = overlay.resources
        update.capacity_lowest_weight = overlay.weight
        update.capacity_lowest_overlay = overlay.name


def _build_views(
    catalog: Catalog, store: Mapping[str, Mapping[str, _TypeUpdate]], result: OverlayResult
) -> None:
    changed: dict[str, dict[str, set[str]]] = {}  # overlay -> pool -> instance types
    # Pools given the same changes of a type share one overlaid type (and so one simulator type).
    built: dict[tuple[str, tuple[tuple[int, str], ...], tuple[tuple[str, int], ...]], InstanceType] = {}
    for pool in sorted(store):
        types = dict(catalog.types)
        for type_name, update in store[pool].items():
            it = catalog.types[type_name]
            if update.prices:
                result.prices[(pool, type_name)] = (it, update.prices)
            for overlay in {p.overlay for p in update.prices.values()} | set(update.capacity_by.values()):
                changed.setdefault(overlay, {}).setdefault(pool, set()).add(type_name)
            key = (
                type_name,
                tuple(sorted((i, p.change) for i, p in update.prices.items())),
                tuple(sorted(update.capacity.items())),
            )
            known = built.get(key)
            if known is None:
                offerings = list(it.offerings)
                for index, price in update.prices.items():
                    offering = offerings[index]
                    offerings[index] = dataclasses.replace(
                        offering, price=adjusted_price(offering.price, price.change)
                    )
                known = built[key] = _overlaid(it, tuple(offerings), update.capacity)
            types[type_name] = known
        result.views[pool] = Catalog(region=catalog.region, types=types, source=catalog.source)
    for overlay in sorted(changed):
        pools = changed[overlay]
        count = len(set().union(*pools.values()))
        result.notes.append(
            f"NodeOverlay {overlay}: {count} instance type(s) in NodePool(s) {', '.join(sorted(pools))}"
        )


def _overlaid(it: InstanceType, offerings: tuple[Offering, ...], capacity: Mapping[str, int]) -> InstanceType:
    fields = _fields(it)
    fields["offerings"] = offerings
    if not capacity:
        return InstanceType(**fields)
    return OverlaidInstanceType(**fields, extended_capacity=tuple(sorted(capacity.items())))


# --- Once per snapshot and catalog ------------------------------------------------------------------


# The overlaid catalogs of the last few inputs: a pass pays for the overlays only when the catalog,
# an overlay, or a NodePool's name or template labels (all an overlay reads of a pool) changed. The
# snapshot builder hands each pass the same parsed NodeOverlay objects while they do not change, so
# overlays are compared by identity (the entry holds them: no other object can take their ids);
# NodePools by what overlays read, since their status changes with every node.
PoolKey = tuple[tuple[str, tuple[tuple[str, str], ...]], ...]


def _pool_key(pools: Sequence[NodePool]) -> PoolKey:
    return tuple((p.name, tuple(sorted(p.spec.template.metadata.labels.items()))) for p in pools)


@dataclass(frozen=True)
class _Entry:
    catalog: Catalog
    overlays: tuple[ReadOverlay, ...]
    pools: PoolKey
    overlaid: Catalog
    result: OverlayResult

    def holds(self, catalog: Catalog, overlays: Sequence[ReadOverlay], pools: PoolKey) -> bool:
        return (
            self.catalog is catalog
            and self.pools == pools
            and len(self.overlays) == len(overlays)
            and all(a is b for a, b in zip(self.overlays, overlays, strict=True))
        )


_RECENT: list[_Entry] = []
_RECENT_SIZE = 4
_LOCK = threading.Lock()


def overlaid_catalog(catalog: Catalog, snapshot: Snapshot) -> tuple[Catalog, OverlayResult]:
    """`catalog` with each NodePool's view overlaid by the snapshot's NodeOverlays (the same catalog
    when none changes anything; one already overlaid is returned as it is)."""
    if catalog.pool_views or not snapshot.node_overlays:
        return catalog, OverlayResult()
    overlays = [snapshot.node_overlays[name] for name in sorted(snapshot.node_overlays)]
    pools = [snapshot.nodepools[name] for name in sorted(snapshot.nodepools)]
    key = _pool_key(pools)
    with _LOCK:
        for entry in _RECENT:
            if entry.holds(catalog, overlays, key):
                return entry.overlaid, entry.result
    result = apply_node_overlays(catalog, overlays, pools)
    overlaid = catalog
    if result.views:
        overlaid = Catalog(
            region=catalog.region, types=catalog.types, source=catalog.source, pool_views=result.views
        )
    with _LOCK:
        _RECENT.insert(0, _Entry(catalog, tuple(overlays), key, overlaid, result))
        del _RECENT[_RECENT_SIZE:]
    return overlaid, result


def overlays_behind(
    result: OverlayResult | None, offerings: Iterable[tuple[str, str, str, str]]
) -> list[str]:
    """The overlays that set the prices of these (pool, instance type, zone, capacity type)
    offerings, by name: what `karpflow plan` names beside a command."""
    if result is None or not result.prices:
        return []
    return sorted({name for key in offerings if (name := result.priced_by(*key)) is not None})
