"""The savings floor: a replace-consolidation that saves too little is not worth its disruption.

A NodePool may set, in karpflow's annotations (api/karpflow_overrides.py):

    karpflow.dev/min-savings-per-hour: "0.05"    # the command must save at least $0.05/h
    karpflow.dev/min-savings-fraction: "10%"     # ... and at least 10 % of what its nodes cost now

Both apply when both are set. The saving is the command's guaranteed one (`savings_per_hour`: the
removed nodes' price minus every replacement's worst-case price). The floor applies to commands that
launch replacements, whatever method or strategy made them (multi- and single-node consolidation;
an Optimal plan as a whole when it starts, planner/optimal/, since its moves may invest in a node
later moves fill); a delete costs no launch and is never held back, nor are drift and expiration. A
command that spans pools must clear the floor of each of them. Karpenter's answer to the same
complaint is the Balanced policy (behaviour notes §2.7); a floor in money is easier to reason about.

A value that does not parse is reported among the plan's problems and fails closed for what it
guards: no replace-consolidation for that pool until it is fixed (deletes go on).
"""

from __future__ import annotations

import functools

from api.karpflow_overrides import SAVINGS_FLOOR_KEYS, SavingsFloor, read_savings_floor
from api.nodepool import NodePool
from planner.model import Command, PlanContext
from planner.snapshot import Snapshot

# The start of every explanation this module gives, so a node is told once per method.
MARKER = "savings floor:"


def savings_floor(pool: NodePool) -> tuple[SavingsFloor, list[str]]:
    """The pool's floor and the problems of its annotations (parsed once per distinct value)."""
    annotations = pool.metadata.annotations
    return _parsed(tuple(sorted((k, str(v)) for k, v in annotations.items() if k in SAVINGS_FLOOR_KEYS)))


@functools.lru_cache(maxsize=256)
def _parsed(annotations: tuple[tuple[str, str], ...]) -> tuple[SavingsFloor, list[str]]:
    return read_savings_floor(dict(annotations))


def floor_problems(snapshot: Snapshot) -> list[str]:
    """One line per bad savings-floor annotation, for the plan's problems."""
    out = []
    for name, pool in sorted(snapshot.nodepools.items()):
        for problem in savings_floor(pool)[1]:
            out.append(
                f"NodePool {name}: {problem} (replace-consolidation of the pool is off until it is fixed)"
            )
    return out


def below_floor(command: Command) -> str | None:
    """Why this replace is not worth its disruption; None for a delete or a replace that clears every
    floor of its pools."""
    if not command.replacements:
        return None
    saving = command.savings_per_hour
    source = command.source_price
    pools = {c.pool_name: c.nodepool for c in command.candidates}
    for name in sorted(pools):
        floor, problems = savings_floor(pools[name])
        if problems:
            return (
                f"{MARKER} nodepool {name} has an invalid savings floor ({problems[0]}); replaces fail closed"
            )
        if floor.per_hour is not None and saving < floor.per_hour:
            return (
                f"{MARKER} the replace saves ${saving:.4f}/h, under nodepool {name}'s "
                f"min-savings-per-hour ${floor.per_hour:.4f}/h"
            )
        if floor.fraction is not None and saving < floor.fraction * source:
            share = saving / source if source > 0 else 0.0
            return (
                f"{MARKER} the replace saves ${saving:.4f}/h ({share:.1%} of ${source:.4f}/h), under "
                f"nodepool {name}'s min-savings-fraction {floor.fraction:.1%}"
            )
    return None


def explain_skipped(ctx: PlanContext, method: str, command: Command, why: str) -> None:
    """Tell each node of a command skipped for the floor why, once per method (a search may skip
    several commands holding the same node)."""
    for node in command.nodes:
        told = ctx.explanations.get(node, [])
        if not any(m == method and text.startswith(MARKER) for m, text in told):
            ctx.explain(node, method, why)


__all__ = ["MARKER", "below_floor", "explain_skipped", "floor_problems", "savings_floor"]
