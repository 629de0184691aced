"""The planner's shared vocabulary: candidates, commands, budgets, the Method interface and the
scheduling-simulation contract.

How a pass works (`planner.plan.plan`):
1. `candidates.build_candidates(ctx)` turns every managed node into a `Candidate` or a `Blocked`
   entry with a readable reason (§1.3 of the behaviour notes).
2. For each `Method` in order (emptiness, drift, Optimal consolidation for the NodePools that opt in,
   multi-node, single-node consolidation):
   - the candidates the method may touch are those passing `method.should_disrupt(ctx, c)` (and the
     class rule: graceful methods skip candidates with `pod_block`), sorted by disruption cost
     (emptiness and consolidation re-order them by savings ratio: planner/balanced.py);
   - `budgets.build_budget_map(ctx, method.reason)` gives the per-pool allowance;
   - `method.compute(ctx, candidates, budget_map)` returns commands, spending the budget with
     `budget_map.take(pool, reason)` for every candidate it puts in a command;
   - the first method that returns commands ends the pass (unless `options.all_methods`).
3. Before a command runs (in the controller workflow, after a durable 15 s timer) it is re-checked
   with `method.validate(fresh_ctx, command) -> ValidationResult` on a fresh snapshot.

Implementing a method: a class with the attributes and the three methods of `Method` below,
constructible without arguments. `plan()` picks up `MultiNodeConsolidation` and
`SingleNodeConsolidation` from planner/consolidation.py and `simulate` from planner/scheduling/adapter.py
when those modules exist. Helpers to use rather than re-write:
`candidates.consolidation_block(ctx, c)` (the consolidation-only filter: instance type and labels
known, consolidateAfter not Never, Consolidatable, node not do-not-consolidate),
`candidates.sort_by_disruption_cost`, `candidates.round_robin_by_nodepool`,
`ctx.explain(node, method, text)` (why a candidate was not chosen, shown by `karpflow plan`).

The scheduling simulation (planner/scheduling/) is reached through `ctx.simulate(ctx, candidates,
pods)`, which must satisfy the `Simulate` protocol and return a `SchedulingResult`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from api.constants import REASON_DRIFTED, REASON_EMPTY, REASON_EXPIRED, REASON_UNDERUTILIZED
from api.workflow_ids import command_hash
from kube.eviction_cost import empty_by_eviction_cost
from planner.node_overlay import OverlayResult, overlaid_catalog

if TYPE_CHECKING:
    from api.nodepool import NodePool
    from planner.catalog import Catalog, InstanceType, Offering
    from planner.pass_cache import PassCache
    from planner.snapshot import Node, NodeClaim, Pod, Snapshot

# Method names as they appear in plans, workflow ids and metrics.
EMPTINESS = "emptiness"
DRIFT = "drift"
MULTI_NODE_CONSOLIDATION = "multi-node-consolidation"
SINGLE_NODE_CONSOLIDATION = "single-node-consolidation"
EXPIRATION = "expiration"
# karpflow's opt-in target-fleet consolidation (planner/optimal/).
OPTIMAL_CONSOLIDATION = "optimal-consolidation"

# Consolidation types (Karpenter's `consolidation_type` metric label).
CONSOLIDATION_EMPTY = "empty"
CONSOLIDATION_MULTI = "multi"
CONSOLIDATION_SINGLE = "single"
CONSOLIDATION_OPTIMAL = "optimal"
# A method's consolidation type, by method name ("" for the others: drift, the forceful ones).
CONSOLIDATION_TYPE_OF = {
    EMPTINESS: CONSOLIDATION_EMPTY,
    MULTI_NODE_CONSOLIDATION: CONSOLIDATION_MULTI,
    SINGLE_NODE_CONSOLIDATION: CONSOLIDATION_SINGLE,
    OPTIMAL_CONSOLIDATION: CONSOLIDATION_OPTIMAL,
}

__all__ = [
    "CONSOLIDATION_TYPE_OF",
    "DRIFT",
    "EMPTINESS",
    "EXPIRATION",
    "MULTI_NODE_CONSOLIDATION",
    "OPTIMAL_CONSOLIDATION",
    "REASON_DRIFTED",
    "REASON_EMPTY",
    "REASON_EXPIRED",
    "REASON_UNDERUTILIZED",
    "SINGLE_NODE_CONSOLIDATION",
    "Blocked",
    "BudgetMap",
    "Candidate",
    "Command",
    "DisruptionClass",
    "DriftStatus",
    "Method",
    "PlanContext",
    "PlanOptions",
    "Replacement",
    "SchedulingResult",
    "Simulate",
    "ValidationResult",
]


class DisruptionClass(StrEnum):
    """How a method treats pods that block eviction (§1.2).

    graceful: a do-not-disrupt pod or a blocking PDB excludes the node (all consolidation methods).
    eventual: with a terminationGracePeriod on the node, blocking pods do not exclude it (drift);
              the TGP bounds the drain.
    forceful: nothing excludes the node and no budget applies (expiration).
    """

    GRACEFUL = "graceful"
    EVENTUAL = "eventual"
    FORCEFUL = "forceful"


# --- Options --------------------------------------------------------------------------------------


class PlanOptions(BaseModel):
    """Knobs of one planning pass. Defaults are Karpenter's, but for drift's pace
    (`drift_commands_per_pass`)."""

    model_config = ConfigDict(extra="forbid")

    # Evaluate every method and report all their commands, instead of stopping at the first method
    # that produced one (what a real pass does).
    all_methods: bool = False
    # Multi-node consolidation gives up after this long and keeps its best command so far (§2.2).
    multi_node_timeout: timedelta = timedelta(minutes=1)
    # Single-node consolidation stops after this long (§2.3).
    single_node_timeout: timedelta = timedelta(minutes=3)
    # Multi-node consolidation considers at most this many candidates (Karpenter: 100).
    multi_node_max_candidates: int = Field(default=100, ge=2)
    # Drift as a method (Karpenter's featureGates.drift / the seed's driftEnabled). Off: no drift
    # commands, and the seed-era `karpenter.sh/voluntary-disruption: drifted` markers are removed.
    drift: bool = True
    # Drift commands one pass may start, validated together (planner/drift_batch.py); each still
    # within the Drifted budget, NodeDisruptionBudgets, rate budgets and windows. 1 is Karpenter's
    # pace (one per pass, the next pass at once). Not Karpenter's default, on purpose: at 5,000
    # nodes a pass takes seconds, and one per pass fills a 10 % budget in minutes instead of one
    # pass (docs/operator-controls.md "Drift at the budget's speed"). The cap keeps a pass's
    # result and the controller's history within Temporal's payload limits.
    drift_commands_per_pass: int = Field(default=100, ge=1, le=1000)
    # SpotToSpotConsolidation feature gate (off by default, §2.5).
    spot_to_spot: bool = False
    # NodeOverlay feature gate (Karpenter v1.7 alpha, off by default as Karpenter's): the snapshot's
    # NodeOverlays change each NodePool's prices and extended capacity (planner/node_overlay.py).
    node_overlay: bool = False
    # Preferred affinities and ScheduleAnyway spreads: Respect (relaxed only when needed) or Ignore.
    preference_policy: Literal["Respect", "Ignore"] = "Respect"
    # NodePool minValues on new nodes (Karpenter's --min-values-policy, v1.6): Strict refuses a new
    # node whose options span too few values; BestEffort lowers minValues to what they reach
    # (planner/scheduling/min_values.py).
    min_values_policy: Literal["Strict", "BestEffort"] = "Strict"
    # Drift a node whose instance type left the catalog or lost its offering (Karpenter's
    # InstanceTypeNotFound). Off by default: with the bundled table a real cluster would drift
    # every node of a type the table does not list. Turn on with a live or complete catalog.
    instance_type_drift: bool = False
    # NodePools a previous single-node pass never reached because it timed out: they go first.
    single_node_priority_pools: list[str] = Field(default_factory=list)
    # karpflow extension, off by default: multi-node consolidation may replace its candidates with
    # up to this many new nodes (strictly cheaper in total, worst case) instead of at most one.
    # 1 is Karpenter's rule (§2.4: "consolidation never turns m nodes into 2 or more").
    max_replacements: int = Field(default=1, ge=1, le=100)
    # Node repair (Karpenter v1.1+ NodeRepair, planner/repair.py): "<condition>=<status>" -> how long
    # a node may stay so before it is replaced. Empty turns repair off.
    repair_tolerations: dict[str, timedelta] = Field(
        default_factory=lambda: {
            "Ready=False": timedelta(minutes=30),
            "Ready=Unknown": timedelta(minutes=30),
            "AcceleratedHardwareReady=False": timedelta(minutes=10),
            "StorageReady=False": timedelta(minutes=30),
            "NetworkingReady=False": timedelta(minutes=30),
            "KernelReady=False": timedelta(minutes=30),
            "ContainerRuntimeReady=False": timedelta(minutes=30),
        }
    )
    # '<nodepool>/<reason>' -> why: pools the controller backs off for a reason after failed commands.
    # Their candidates are left out of that reason's methods, so the budgeted commands of the pass go
    # to the other pools (forceful methods ignore backoffs).
    backed_off: dict[str, str] = Field(default_factory=dict)
    # Repair stops for a NodePool when more than this share of its nodes is unhealthy: then the
    # cluster is sick, not the node, and replacing nodes would not help (Karpenter: 20 %).
    repair_max_unhealthy: float = Field(default=0.2, ge=0, le=1)
    # The cluster-health breaker (planner/health_breaker.py): voluntary disruption pauses while more
    # than `breaker_ok_unready` nodes and `breaker_max_unready` of them are NotReady (Cluster
    # Autoscaler's rule and defaults), or more than `breaker_max_pending_pods` pods have been pending
    # for longer than `breaker_pending_for` (0: no pending-pod rule).
    breaker: bool = True
    breaker_max_unready: float = Field(default=0.45, ge=0, le=1)
    breaker_ok_unready: int = Field(default=3, ge=0)
    breaker_node_startup: timedelta = timedelta(minutes=15)
    breaker_max_pending_pods: int = Field(default=100, ge=0)
    breaker_pending_for: timedelta = timedelta(minutes=10)
    # Consolidation strategy for every NodePool, overriding their karpflow.dev/consolidation-strategy
    # annotations (`karpflow plan --strategy`, benches). None: each pool's annotation (default Karpenter).
    consolidation_strategy: Literal["Karpenter", "Optimal"] | None = None
    # Time the Optimal method's solver may take per pass (planner/optimal/); it returns its best
    # answer when the time is up.
    optimal_time_limit: timedelta = timedelta(seconds=1.8)
    # What the Optimal target charges a moved pod: moving every pod of the scope costs this share of
    # its fluid optimum (planner/optimal/solver.py). Higher keeps more nodes and evicts fewer pods
    # for a dearer fleet (docs/optimal-consolidation.md has the measured trade-off).
    optimal_churn_share: float = Field(default=0.15, ge=0)
    # An Optimal plan still not done after this long is dropped (and a new one may start): its moves
    # keep failing somewhere the plan cannot see, e.g. their validation.
    optimal_plan_max_age: timedelta = timedelta(hours=1)


# --- Candidates -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DriftStatus:
    """Why a node is drifted (Karpenter's Drifted condition reason) and since when (for ordering)."""

    reason: str  # NodePoolDrifted, RequirementsDrifted, NodeClassDrifted, AMIDrift, SubnetDrift, ...
    detail: str
    since: datetime | None


@dataclass(eq=False)
class Candidate:
    """A managed, initialized node that some method may disrupt, with what the rules need."""

    node: Node
    nodepool: NodePool
    instance_type: InstanceType | None  # None when the catalog does not know the type
    capacity_type: str | None
    zone: str | None
    # Hourly price of the node's own offering (zone + capacity type); None when unknown.
    price: float | None
    # Pods that must move if the node goes (§1.3): active, or terminating StatefulSet pods; never
    # DaemonSet or mirror pods.
    reschedulable_pods: list[Pod]
    # Karpenter's ordering cost: sum of pod eviction costs * lifetime remaining (§1.4).
    disruption_cost: float
    # Latest pod event on the node (or when it became Ready); the consolidateAfter clock.
    last_pod_event: datetime | None
    # When the node becomes Consolidatable; None when consolidation is disabled (consolidateAfter Never).
    consolidatable_at: datetime | None
    # A do-not-disrupt pod or a blocking PDB ("pdb default/web prevents pod evictions"); graceful
    # methods skip such candidates, eventual ones (drift with a TGP) do not.
    pod_block: str | None = None
    nodeclaim: NodeClaim | None = None
    termination_grace_period: timedelta | None = None
    expire_after: timedelta | None = None
    drift: DriftStatus | None = None

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def pool_name(self) -> str:
        return self.nodepool.name

    @property
    def instance_type_name(self) -> str | None:
        return self.node.instance_type

    @property
    def is_empty(self) -> bool:
        """No reschedulable pod at all: nothing needs a place if the node goes (drift's order, and
        whether a forceful method buys capacity ahead). Emptiness uses `empty_by_eviction_cost`."""
        return not self.reschedulable_pods

    @property
    def empty_by_eviction_cost(self) -> bool:
        """Karpenter's `Candidate.IsEmpty` (v1.14): no reschedulable pod with a positive eviction cost
        (kube/eviction_cost.py). Emptiness takes such a node, and consolidation leaves it to emptiness."""
        return empty_by_eviction_cost(p.eviction_cost for p in self.reschedulable_pods)

    def consolidatable(self, now: datetime) -> bool:
        return self.consolidatable_at is not None and now >= self.consolidatable_at

    def __repr__(self) -> str:
        return f"Candidate({self.name}, pool={self.pool_name}, pods={len(self.reschedulable_pods)})"


@dataclass(frozen=True, slots=True)
class Blocked:
    """A managed node no method may touch in this pass, and why (Karpenter's DisruptionBlocked)."""

    node: str
    reason: str
    nodepool: str | None = None


# --- Commands -------------------------------------------------------------------------------------


@dataclass(eq=False)
class Replacement:
    """A new node to launch: a NodeClaim-to-be. Instance types are the launch options, cheapest first."""

    nodepool: str
    instance_types: list[InstanceType]
    capacity_type: str
    zones: list[str]
    pods: list[Pod] = field(default_factory=list)  # what the simulation placed on it
    # Written on the node when it registers: Optimal consolidation's plan marker (planner/optimal/held.py),
    # Karpenter's karpenter.sh/nodeclaim-min-values-relaxed.
    annotations: dict[str, str] = field(default_factory=dict)
    # The minValues the new node's requirements carry, per key (lowered under MinValuesPolicy
    # BestEffort): what a NodeClaim written for it says (activities/nodeclaims.py).
    min_values: dict[str, int] = field(default_factory=dict)

    # A reserved replacement: the (instance type, reserved offering) pairs the pass reserved for it
    # (planner/reservations.py); it is launched into these only.
    reserved: list[tuple[str, Offering]] = field(default_factory=list)

    @property
    def reservation_ids(self) -> list[str]:
        return sorted({o.reservation.id for _, o in self.reserved if o.reservation is not None})

    @property
    def instance_type_names(self) -> list[str]:
        return [t.name for t in self.instance_types]

    @property
    def price(self) -> float | None:
        """Cheapest available offering among the options (what the launch is expected to cost)."""
        prices = [
            p
            for t in self.instance_types
            if (p := t.cheapest_price([self.capacity_type], self.zones)) is not None
        ]
        return min(prices) if prices else None

    @property
    def worst_case_price(self) -> float | None:
        """Most expensive available offering among the options (what the launch could cost)."""
        prices = [
            p
            for t in self.instance_types
            if (p := t.worst_case_price([self.capacity_type], self.zones)) is not None
        ]
        return max(prices) if prices else None


@dataclass(eq=False)
class Command:
    """One decision: disrupt these candidates, launching these replacements first.

    The decision (delete / replace) is derived from the replacements, never stored, as in Karpenter.
    """

    method: str
    reason: str
    candidates: list[Candidate]
    replacements: list[Replacement] = field(default_factory=list)
    disruption_class: DisruptionClass = DisruptionClass.GRACEFUL
    # Free text for people: why this command (e.g. the drift detail or the consolidation savings).
    message: str = ""
    # Where the simulation put moved pods that stay on existing nodes (pod key -> node name); the
    # pods for each replacement are in `Replacement.pods`. A prediction: the kube-scheduler decides.
    placements: dict[str, str] = field(default_factory=dict)
    # consolidationPolicy Balanced: each Balanced source pool's verdict, e.g. "score 1.67 >= 0.5"
    # (planner/balanced.py); empty when no source pool is Balanced.
    scores: list[str] = field(default_factory=list)
    # Emptiness: the ready CapacityBuffers the decision accounted for (namespace/name -> replicas);
    # the taint re-checks that none is new or bigger (activities/buffer_guard.py). None: not judged.
    capacity_buffers: dict[str, int] | None = None

    @property
    def decision(self) -> Literal["delete", "replace"]:
        return "replace" if self.replacements else "delete"

    @property
    def nodes(self) -> list[str]:
        return [c.name for c in self.candidates]

    @property
    def nodepools(self) -> list[str]:
        return sorted({c.pool_name for c in self.candidates})

    @property
    def source_price(self) -> float:
        return sum(c.price or 0.0 for c in self.candidates)

    @property
    def replacement_price(self) -> float:
        """What the replacements are expected to cost: each at its cheapest option."""
        return sum(r.price or 0.0 for r in self.replacements)

    @property
    def replacement_worst_case_price(self) -> float:
        """What the replacements could cost: each at its most expensive option."""
        return sum(r.worst_case_price or 0.0 for r in self.replacements)

    @property
    def savings_per_hour(self) -> float:
        """Guaranteed hourly saving: cost removed minus the replacements' worst case, the price the
        decision was made on (a launch may land on any of its options). Expiration saves nothing: the
        provisioner brings the capacity back, so it reports 0."""
        if self.method == EXPIRATION:
            return 0.0
        return round(self.source_price - self.replacement_worst_case_price, 6)

    @property
    def savings_per_hour_best(self) -> float:
        """Hourly saving if every replacement launches as its cheapest option."""
        if self.method == EXPIRATION:
            return 0.0
        return round(self.source_price - self.replacement_price, 6)

    @property
    def id(self) -> str:
        """Stable short id for workflow ids: `disruption/<pool>/<reason>/<id>`."""
        return command_hash(self.method, self.reason, self.nodes)

    def __repr__(self) -> str:
        return (
            f"Command({self.method}: {self.decision} {self.nodes} -> {len(self.replacements)} replacement(s))"
        )


@dataclass(frozen=True, slots=True)
class ValidationResult:
    """Outcome of re-checking a command on a fresh snapshot (§1.7).

    `command` is what may run: the same command, a subset (emptiness keeps the still-valid nodes), or
    None when invalid. `reason` says why it failed or shrank ("churn", "budget", "scheduling", ...).
    """

    valid: bool
    command: Command | None
    reason: str = ""


# --- Budgets --------------------------------------------------------------------------------------


@dataclass
class BudgetMap:
    """Disruptions still allowed per NodePool for one reason, spent as methods pick candidates.

    Built by `planner.budgets.build_budget_map`. Pools absent from the map (unknown) allow nothing.
    """

    reason: str
    remaining: dict[str, int]
    # For reporting: per pool, the allowed count before in-flight disruptions were subtracted, the
    # node total the percentages were computed on, the nodes disrupting (those already in flight
    # when the pass started plus `planned`), those this pass's earlier commands disrupt, and parse
    # errors.
    allowed: dict[str, int] = field(default_factory=dict)
    total: dict[str, int] = field(default_factory=dict)
    disrupting: dict[str, int] = field(default_factory=dict)
    planned: dict[str, int] = field(default_factory=dict)
    errors: dict[str, list[str]] = field(default_factory=dict)
    # pool -> why a rate budget (`per`, planner/rate_budgets.py) limits it below its concurrency
    # budget, as a function of what is left.
    rate_limited: dict[str, Callable[[int], str]] = field(default_factory=dict)

    def available(self, pool: str) -> int:
        return self.remaining.get(pool, 0)

    def take(self, pool: str, count: int = 1) -> bool:
        """Spend `count` disruptions of the pool; False (and nothing spent) if not enough are left."""
        left = self.remaining.get(pool, 0)
        if left < count:
            return False
        self.remaining[pool] = left - count
        return True

    def give_back(self, pool: str, count: int = 1) -> None:
        """Return `count` disruptions taken for a command that was not made after all (a drift
        batch's member whose pods do not fit)."""
        self.remaining[pool] = self.remaining.get(pool, 0) + count

    def copy(self) -> BudgetMap:
        return BudgetMap(
            self.reason,
            dict(self.remaining),
            dict(self.allowed),
            dict(self.total),
            dict(self.disrupting),
            dict(self.planned),
            self.errors,
            self.rate_limited,
        )

    def exhausted_message(self, pool: str) -> str:
        """Readable reason a pool cannot disrupt for this reason now."""
        if self.errors.get(pool):
            first = self.errors[pool][0]
            return f"nodepool {pool} has an invalid disruption budget ({first}); budgets fail closed"
        if pool in self.rate_limited and self.remaining.get(pool, 0) == 0:
            return self.rate_limited[pool](0)
        allowed, planned = self.allowed.get(pool, 0), self.planned.get(pool, 0)
        if allowed == 0:
            return f"nodepool {pool} budget allows no {self.reason} disruptions now"
        disrupting = self.disrupting.get(pool, 0)
        in_flight = disrupting - planned
        # Spent by the commands of this plan: earlier ones (planned) and this method's own (taken).
        by_plan = planned + max(allowed - disrupting, 0) - self.remaining.get(pool, 0)
        parts = [f"{in_flight} already disrupting"] if in_flight or not by_plan else []
        if by_plan:
            parts.append(f"{by_plan} by this plan's commands")
        return (
            f"nodepool {pool} budget for {self.reason} is used up "
            f"({allowed} allowed: {', '.join(parts)}; {self.remaining.get(pool, 0)} left)"
        )


# --- Scheduling simulation contract ---------------------------------------------------------------


@dataclass
class SchedulingResult:
    """What happens to pods if `candidates` disappear (§2.6).

    placements: pod key ("ns/name") -> name of the existing node it lands on.
    new_nodes: nodes that would have to be launched, each with its pods and launch options.
    unschedulable: pod key -> why it fits nowhere.
    pending: keys of pods that were pending before the simulation; their failures are tolerated.
    new_node_owners: when each candidate's pods got new nodes of their own (`ctx.claims_per_node`),
    the candidate whose pods each of `new_nodes` holds, in their order (None: no candidate's);
    empty when the simulation did not keep them apart.
    """

    placements: dict[str, str] = field(default_factory=dict)
    new_nodes: list[Replacement] = field(default_factory=list)
    unschedulable: dict[str, str] = field(default_factory=dict)
    pending: frozenset[str] = frozenset()
    new_node_owners: list[str | None] = field(default_factory=list)

    def non_pending_failures(self) -> dict[str, str]:
        return {k: v for k, v in self.unschedulable.items() if k not in self.pending}

    def all_non_pending_scheduled(self) -> bool:
        return not self.non_pending_failures()


class Simulate(Protocol):
    """The scheduling simulation (planner/scheduling/adapter.py exposes one as `simulate`).

    Remove `candidates` from the cluster of `ctx.snapshot` (also treating `ctx.marked_for_deletion`
    nodes as gone) and place `pods` on the remaining existing nodes first, then on new nodes built
    from the NodePools' templates and `ctx.catalog`, honouring `ctx.options.preference_policy`.
    With `pods=None` the pods are the §2.6 default: the candidates' reschedulable pods (minus
    do-not-disrupt pods and pods under fully blocking PDBs), the pending pods, and the reschedulable
    pods of nodes already being deleted.
    """

    def __call__(
        self, ctx: PlanContext, candidates: Sequence[Candidate], pods: Sequence[Pod] | None = None
    ) -> SchedulingResult: ...


# --- Context and methods --------------------------------------------------------------------------


@dataclass
class PlanContext:
    """Everything a method may read during one pass. No I/O: all of it is data."""

    snapshot: Snapshot
    catalog: Catalog
    options: PlanOptions = field(default_factory=PlanOptions)
    simulate: Simulate | None = None
    # Nodes this pass has already decided to delete (expiration): they count as disrupting in budgets
    # and are not candidates; the simulation treats them as going away.
    marked_for_deletion: set[str] = field(default_factory=set)
    # Monotonic clock for method timeouts; injectable so tests can make time pass.
    clock: Callable[[], float] = time.monotonic
    # node -> [(method, why it was not chosen)], shown by `karpflow plan`.
    explanations: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    # Nodes a target-fleet method will remove in a later pass (they get karpflow.io/leaving); None
    # when no such method ran this pass (planner/optimal/leaving.py).
    leaving: set[str] | None = None
    # method name -> what it wants `karpflow plan` to show beside its commands (e.g. the target fleet).
    outcomes: dict[str, Any] = field(default_factory=dict)
    # The Optimal plan its nodes' markers hold (planner/optimal/held.py `HeldPlan`), read before the
    # methods run; the Optimal method sets it to None when the plan ends. Karpenter's consolidation
    # methods leave its NodePools to it (planner/plan.py).
    optimal_plan: Any = None
    # Plan-marker annotations the Optimal method wants (node, JSON value or None to remove); None when
    # it did not run this pass (then only markers on nodes of pools that left the strategy go).
    plan_markers: list[tuple[str, str | None]] | None = None
    # $/h the Optimal method charges a moved pod this pass (None when it did not run): Karpenter's
    # methods, its fallback, must save at least that on Optimal pools too (planner/plan.py).
    optimal_churn: float | None = None
    # Values derived once per pass and read for every node (e.g. each NodePool's template hash).
    memo: dict[Any, Any] = field(default_factory=dict)
    # Per-node work kept from the previous pass by the caller (planner/pass_cache.py); None: none kept.
    cache: PassCache | None = None
    # Expired nodes a MaintenanceWindow held back in this pass (planner/expiration.py): they get
    # karpflow.io/expiration-deferred, and are paced like a voluntary method once the window allows.
    deferred_expirations: set[str] = field(default_factory=set)
    # Nodes the simulation must not place pods on, though they keep theirs: the members of a drift
    # batch not simulated yet (planner/drift_batch.py), which this pass may still remove.
    closed_nodes: frozenset[str] = frozenset()
    # Set while a batch of forceful commands simulates its nodes together (planner/forceful_batch.py):
    # each candidate's pods get new nodes of their own (`SchedulingResult.new_node_owners`).
    claims_per_node: bool = False
    # What the NodeOverlays changed (planner/node_overlay.py); None while the gate is off.
    node_overlays: OverlayResult | None = None

    def __post_init__(self) -> None:
        # Every context, whoever builds it, plans on the catalog its NodePools see.
        if self.options.node_overlay and self.node_overlays is None:
            self.catalog, self.node_overlays = overlaid_catalog(self.catalog, self.snapshot)

    @property
    def now(self) -> datetime:
        return self.snapshot.now

    def explain(self, node: str, method: str, text: str) -> None:
        """Record why `method` left `node` alone (Karpenter's Unconsolidatable / DisruptionBlocked)."""
        self.explanations.setdefault(node, []).append((method, text))


class Method(Protocol):
    """A disruption method (one file per method in planner/)."""

    name: str  # EMPTINESS, DRIFT, ...
    reason: str  # budget reason: Empty, Drifted, Underutilized
    disruption_class: DisruptionClass
    consolidation_type: str  # "empty", "multi", "single" or "" (drift)

    def should_disrupt(self, ctx: PlanContext, candidate: Candidate) -> bool:
        """Whether this method may consider the candidate at all (may `ctx.explain` when not)."""
        ...

    def compute(self, ctx: PlanContext, candidates: list[Candidate], budgets: BudgetMap) -> list[Command]:
        """Commands for this pass. `candidates` passed should_disrupt and are in disruption-cost
        order; spend `budgets` with `budgets.take(pool)` for each candidate put in a command."""
        ...

    def validate(self, ctx: PlanContext, command: Command) -> ValidationResult:
        """Re-check `command` against the fresh snapshot in `ctx` before it runs."""
        ...
