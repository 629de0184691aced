"""consolidationPolicy: Balanced (Karpenter v1.14): a consolidation move is taken only when what it
saves is worth what it disrupts, both measured against the NodePool it comes from.

Karpenter's rule (kubernetes-sigs/karpenter pkg/controllers/disruption/balanced.go and types.go,
designs/balanced-consolidation.md):
- a node's disruption cost is 1.0 (the node itself) plus max(0, eviction cost) of each pod that
  must move (`RescheduleDisruptionCost`);
- a NodePool's totals are the price of all its nodes and the disruption cost of all its nodes,
  candidates or not (`computeNodePoolTotals`);
- a move's score is (savings / pool cost) / (move disruption / pool disruption), 0 when the move
  saves nothing or the pool's totals are not positive, +inf when the move disrupts nothing
  (`ScoreMove`, `ScoreResult.Score`); savings are the candidates' price minus the replacements'
  cheapest price (`Command.EstimatedSavings`);
- the move is approved when score >= 1/k, k = 2 (`BalancedK`, `ScoreResult.Approved`); a move across
  NodePools needs every Balanced source pool to approve, each credited with the share of the net
  savings its nodes' price makes up (`EvaluateBalancedMove`); pools with another policy are not scored;
- single-node consolidation skips a candidate whose best case (deleting it outright) already fails
  (`CanPassThreshold`); emptiness is never scored, so empty nodes are deleted in every policy.
Scoring applies to consolidation only (not drift, expiration or interruption).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from api.constants import NODEPOOL_LABEL
from kube.eviction_cost import reschedule_disruption_cost as node_reschedule_cost
from planner.candidates import node_price
from planner.model import Candidate, Command, PlanContext
from planner.pass_cache import node_pods
from planner.snapshot import Pod

BALANCED = "Balanced"
BALANCED_K = 2  # Karpenter's v1.BalancedK: approve when score >= 1/2


def is_balanced(candidate: Candidate) -> bool:
    return candidate.nodepool.spec.disruption.consolidation_policy == BALANCED


def reschedule_disruption_cost(pods: Iterable[Pod]) -> float:
    """1.0 for the node plus each pod's eviction cost, negatives as 0 (kube/eviction_cost.py)."""
    return node_reschedule_cost(p.eviction_cost for p in pods)


def candidate_disruption_cost(candidate: Candidate) -> float:
    return reschedule_disruption_cost(candidate.reschedulable_pods)


def savings_ratio(candidate: Candidate) -> float:
    """Karpenter's Candidate.SavingsRatio: price per unit of disruption (an unpriced node is 0)."""
    return (candidate.price or 0.0) / candidate_disruption_cost(candidate)


def sort_by_savings_ratio(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Karpenter's consolidation order (pkg/controllers/disruption/consolidation.go sortCandidates):
    highest price per unit of disruption first; the node name breaks ties so plans are deterministic."""
    return sorted(candidates, key=lambda c: (-savings_ratio(c), c.name))


@dataclass(frozen=True, slots=True)
class PoolTotals:
    """What a NodePool's nodes cost per hour and what disrupting all of them would cost."""

    cost: float
    disruption_cost: float


@dataclass(frozen=True, slots=True)
class Score:
    """One pool's verdict on a move (Karpenter's ScoreResult)."""

    pool: str
    savings_fraction: float
    disruption_fraction: float
    k: int = BALANCED_K

    @property
    def value(self) -> float:
        if self.savings_fraction <= 0:
            return 0.0
        if self.disruption_fraction == 0:
            return math.inf
        return self.savings_fraction / self.disruption_fraction

    @property
    def threshold(self) -> float:
        return 1.0 / self.k

    @property
    def approved(self) -> bool:
        return self.value >= self.threshold

    def verdict(self) -> str:
        """`default: score 1.67 >= 0.5` (the `karpflow plan` table's score column)."""
        return f"{self.pool}: score {self.value:.2f} {'>=' if self.approved else 'below'} {self.threshold:g}"

    def describe(self) -> str:
        """`score 0.27 below 0.5 (...)` or `score 1.67 >= 0.5 (...)`, as shown by `karpflow plan`."""
        verdict = ">=" if self.approved else "below"
        return (
            f"score {self.value:.2f} {verdict} {self.threshold:g} (savings {self.savings_fraction:.1%} "
            f"of nodepool {self.pool}'s cost, disruption {self.disruption_fraction:.1%} "
            "of its disruption cost)"
        )


def score_move(pool: str, savings: float, disruption_cost: float, totals: PoolTotals | None) -> Score:
    """Karpenter's ScoreMove; a pool with no (or non-positive) totals scores 0 and is rejected."""
    if totals is None or totals.cost <= 0 or totals.disruption_cost <= 0:
        return Score(pool, 0.0, 0.0)
    return Score(pool, savings / totals.cost, disruption_cost / totals.disruption_cost)


def pool_totals(ctx: PlanContext, pools: Iterable[str]) -> dict[str, PoolTotals]:
    """The totals of `pools` over every node of the snapshot labelled with them (candidates or not,
    as Karpenter's computeNodePoolTotals; an unpriced node adds 0 to the cost)."""
    wanted = set(pools)
    if not wanted:
        return {}  # no Balanced pool: nothing to score, no walk over the nodes
    cost: dict[str, float] = dict.fromkeys(wanted, 0.0)
    disruption: dict[str, float] = dict.fromkeys(wanted, 0.0)
    for node in ctx.snapshot.nodes.values():
        pool = node.labels.get(NODEPOOL_LABEL)
        if pool not in wanted:
            continue
        cost[pool] += node_price(ctx, node) or 0.0
        disruption[pool] += reschedule_disruption_cost(node_pods(ctx.cache, node).reschedulable)
    return {p: PoolTotals(cost[p], disruption[p]) for p in wanted}


class BalancedGate:
    """The Balanced scores of one pass: NodePool totals taken once (as Karpenter snapshots them per
    cycle), then any number of moves scored against them."""

    def __init__(self, ctx: PlanContext, candidates: Sequence[Candidate]) -> None:
        self.totals = pool_totals(ctx, {c.pool_name for c in candidates if is_balanced(c)})

    def can_pass(self, candidate: Candidate) -> Score | None:
        """The best case (deleting the node, nothing launched) when it already fails; None when the
        candidate is worth a simulation (or its pool is not Balanced)."""
        if not is_balanced(candidate):
            return None
        totals = self.totals.get(candidate.pool_name)
        if totals is None or totals.cost <= 0:
            return None  # as Karpenter: nothing to compare against, let the move's own score decide
        best = score_move(
            candidate.pool_name, candidate.price or 0.0, candidate_disruption_cost(candidate), totals
        )
        return None if best.approved else best

    def scores(self, command: Command) -> list[Score]:
        """Each Balanced source pool's score of `command` (empty when no source pool is Balanced)."""
        by_pool: dict[str, list[Candidate]] = {}
        for candidate in command.candidates:
            by_pool.setdefault(candidate.pool_name, []).append(candidate)
        savings = command.source_price - command.replacement_price
        source_cost = command.source_price
        out = []
        for pool, members in sorted(by_pool.items()):
            if not is_balanced(members[0]):
                continue
            pool_savings = savings
            if source_cost > 0 and len(by_pool) > 1:
                pool_savings = savings * (sum(c.price or 0.0 for c in members) / source_cost)
            disruption = sum(candidate_disruption_cost(c) for c in members)
            out.append(score_move(pool, pool_savings, disruption, self.totals.get(pool)))
        return out

    @staticmethod
    def rejection(scores: Sequence[Score]) -> str | None:
        """Why the move is not taken (the first pool that rejects it), or None when all approve."""
        for score in scores:
            if not score.approved:
                return f"consolidationPolicy Balanced: {score.describe()}"
        return None


def describe_scores(scores: Mapping[str, Score] | Sequence[Score]) -> str:
    values = scores.values() if isinstance(scores, Mapping) else scores
    return "; ".join(f"Balanced {s.describe()}" for s in values)
