"""A pass's batch of drift commands: as many as the controls allow, their pods fitting together.

Karpenter starts one drift command per pass and runs the next pass at once; at 5,000 nodes a pass
takes seconds, so a large Drifted budget fills in minutes (kubernetes-sigs/karpenter #3197). Here
one pass starts up to `PlanOptions.drift_commands_per_pass` drift commands (1: Karpenter's pace),
one node each, in drift order (empty first, then the oldest drifted), each within:

- its NodePool's Drifted budget, rate budgets included (`BudgetMap`, planner/budgets.py), counting
  the commands of the batch before it;
- the NodeDisruptionBudgets that select it, counting the batch's nodes (planner/node_disruption_budgets.py);
- MaintenanceWindows and pauses, which the pass checked per candidate before (planner/plan.py
  `_eligible`); static NodePools are StaticDrift's, never drift's.

Validated together by the scheduling simulation, one member at a time in order:
- the members decided before are gone (`ctx.marked_for_deletion`): their pods are placed first, as
  background, so room on existing nodes is never counted twice, and the NodeClaims those pods open
  (the earlier members' replacements) take no pod of a later member, as the simulation says of
  background claims (planner/scheduling/__init__.py);
- the members not decided yet are closed (`ctx.closed_nodes`): they keep their pods but take none,
  so no pod is planned onto a node the same batch removes. A member is chosen before the
  simulations that must not use it; one chosen late (after a member failed) is checked instead:
  if an earlier member's pods were planned onto it, it waits for the next pass;
- a member whose pods cannot all be placed is left out (explained) and the next candidate within
  the controls takes its place; it stays closed for the rest of the pass (so the simulation's
  prepared placements carry on: closed nodes only ever grow within a pass).

A batch of one (`drift_commands_per_pass: 1`) closes nothing: it is Karpenter's Drift exactly.

A wave (issue 35, item 2) will cap a pass's batch further: `room` is where a per-pool limit joins
the budget.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from planner.model import BudgetMap, Candidate, Command, PlanContext, Replacement
from planner.node_disruption_budgets import NdbLedger
from planner.operator_controls import ndb_ledger

# What the batch calls back for each member: the command for a candidate and its replacements.
MakeCommand = Callable[[Candidate, list[Replacement]], Command]


@dataclass
class DriftBatch:
    """One pass's batch, built by `run`: the controls spent as members are chosen and decided."""

    ctx: PlanContext
    method: str
    budgets: BudgetMap
    cap: int
    label: Callable[[Candidate], str]
    commands: list[Command] = field(default_factory=list)
    # Chosen within the controls, not simulated yet: closed to pods (in order).
    tentative: deque[Candidate] = field(default_factory=deque)
    # Left out after the simulation: still closed for the rest of the pass.
    rejected: set[str] = field(default_factory=set)
    # Existing nodes the simulation planned the batch's moving pods onto.
    destinations: set[str] = field(default_factory=set)
    _ledger: NdbLedger | None = None
    _simulated: bool = False
    _late: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.ctx.snapshot.node_disruption_budgets:
            self._ledger = ndb_ledger(self.ctx)

    # -- the controls ------------------------------------------------------------------------------

    def room(self, candidate: Candidate) -> str | None:
        """Why the batch cannot take `candidate` now (None: the controls leave room for it)."""
        pool = candidate.pool_name
        if self.budgets.available(pool) <= 0:
            return self.budgets.exhausted_message(pool)
        if self._ledger is not None and (status := self._ledger.blocking([candidate.name])) is not None:
            return status.message()
        return None

    def _choose(self, candidate: Candidate) -> None:
        # The budget is spent when a member is chosen (what the others are told says so) and given
        # back if its pods do not fit.
        self.tentative.append(candidate)
        self.budgets.take(candidate.pool_name)
        if self._ledger is not None:
            # Spent when chosen: a member left out by the simulation keeps its slot this pass.
            self._ledger.take([candidate.name])
        if self._simulated:
            self._late.add(candidate.name)

    # -- the pass ----------------------------------------------------------------------------------

    def run(self, ordered: Iterable[Candidate], make: MakeCommand) -> list[Command]:
        """The batch's commands, from `ordered` candidates (drift order). Every candidate left out is
        explained on behalf of the method."""
        queue = deque(ordered)
        ctx = self.ctx
        marked, closed = set(ctx.marked_for_deletion), ctx.closed_nodes
        try:
            while len(self.commands) < self.cap:
                self._fill(queue)
                if not self.tentative:
                    break
                candidate = self.tentative.popleft()
                command = self._decide(candidate, make)
                if command is None:
                    self.rejected.add(candidate.name)
                    self.budgets.give_back(candidate.pool_name)
                    continue
                self.commands.append(command)
                ctx.marked_for_deletion.update(command.nodes)
        finally:
            ctx.marked_for_deletion.clear()
            ctx.marked_for_deletion.update(marked)
            ctx.closed_nodes = closed
        for candidate in [*self.tentative, *queue]:
            reason = candidate.drift.reason if candidate.drift else "?"
            ctx.explain(candidate.name, self.method, f"drifted ({reason}); {self._cap_reason()}")
        return self.commands

    def _fill(self, queue: deque[Candidate]) -> None:
        """Choose members until the batch could reach its cap."""
        while queue and len(self.tentative) < self.cap - len(self.commands):
            candidate = queue.popleft()
            why = self.room(candidate)
            if why is not None:
                self.ctx.explain(candidate.name, self.method, f"{self.label(candidate)}; {why}")
                continue
            self._choose(candidate)

    def _decide(self, candidate: Candidate, make: MakeCommand) -> Command | None:
        """The member's command, or None (explained) when it must wait."""
        ctx, label = self.ctx, self.label(candidate)
        if candidate.name in self._late and candidate.name in self.destinations:
            ctx.explain(
                candidate.name,
                self.method,
                f"{label}; pods of drifted nodes this pass replaces are planned onto it, waits for "
                "the next pass",
            )
            return None
        if candidate.is_empty:
            return make(candidate, [])
        if ctx.simulate is None:
            ctx.explain(candidate.name, self.method, f"{label}; no scheduling simulation available")
            return None
        if self.cap > 1:
            # The member itself too: the prepared placement of the previous member's probe, where it
            # was closed, carries on (it is removed from this probe anyway).
            ctx.closed_nodes = frozenset((candidate.name, *(c.name for c in self.tentative))) | self.rejected
        result = ctx.simulate(ctx, [candidate])
        self._simulated = True
        failures = result.non_pending_failures()
        if failures:
            key, why = min(failures.items())
            text = f"{label}; {len(failures)} pod(s) cannot be rescheduled (e.g. {key}: {why})"
            ctx.explain(candidate.name, self.method, text)
            return None
        placements = {
            moved.key: node
            for moved in candidate.reschedulable_pods
            if (node := result.placements.get(moved.key)) is not None
        }
        self.destinations.update(placements.values())
        command = make(candidate, list(result.new_nodes))
        command.placements = placements  # a prediction: the kube-scheduler decides
        return command

    def _cap_reason(self) -> str:
        if self.cap == 1:
            return "one drift command per pass, waits for the next"
        return f"this pass started its {self.cap} drift commands (the most per pass), waits for the next"
