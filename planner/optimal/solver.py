"""The mixed-integer programs behind Optimal consolidation, solved with HiGHS (highspy).

Why HiGHS: a small self-contained wheel (numpy its only dependency; OR-Tools pins protobuf, which
the Temporal SDK also pins), a deterministic branch-and-bound (the same snapshot gives the same plan,
so workflow ids and the 15 s validation agree with the plan), a time limit it always honours, and a
MIP start: today's fleet is always a feasible answer, so the solver returns something at least as
good whenever it stops. The models are small by construction (pods grouped by shape and placement
rules, room pooled by class), so 1,000 nodes are a few thousand columns.

Two programs per pass (planner/optimal/__init__.py tells why two):

**Target fleet.** y_i in {0,1}: keep movable node i; n_o integer: new nodes of launch option o;
x_gc, x_go >= 0: pods of group g moved into room class c / onto new nodes of option o.
    min  sum_i (price_i - churn * pods_i) y_i + sum_o price_o n_o
    s.t. sum_c x_gc + sum_o x_go + sum_i pods_gi y_i = pods_g             (every pod has a place)
         sum_g x_gc req_gd <= room_cd(fixed) + sum_{i in c} free_id y_i    (kept room, per resource)
         sum_g x_go req_gd <= alloc_od n_o                                (new nodes, per resource)

**This pass's step** toward it: z_i in {0,1}: remove node i now (only nodes the target removes),
n'_o <= n_o new nodes now; the same placement rows over the room of the nodes the target keeps;
    max  sum_i price_i z_i - 0.1 sum_o price_o n'_o         (progress first, then saving now)
    s.t. sum_{i in pool p} z_i <= budget_p;  pods of a PDB evicted <= its allowance (one node always);
         with spot-to-spot off: no launch unless an on-demand node goes.

Plus the **fluid optimum** (an LP): the cheapest fractional mix of launch options whose allocatable
covers the demand, the yardstick `karpflow plan --strategy optimal` prints.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import highspy
import numpy as np

from api.constants import CAPACITY_SPOT
from planner.optimal.fleet import FleetProblem, Room

# $/h charged per pod moved: breaks ties toward fewer evictions, and keeps a node whose removal
# would save less than its pods' churn.
CHURN_PER_POD = 0.0005
_EPS = 1e-6
# The step's objective prices a launch at this share of its price: progress toward the target comes
# first, saving now second.
LAUNCH_WEIGHT = 0.1
MIN_STEP_SAVING = 0.001  # $/h
# The step places whole pods node by node when that takes at most this many columns; past it, room
# is pooled per class as in the target.
EXACT_ROOM_COLUMNS = 3000


@dataclass
class TargetFleet:
    keep: set[str]  # movable nodes kept
    remove: list[str]  # movable nodes removed, in the problem's order
    launches: dict[int, int]  # option index -> count
    cost: float  # $/h of the movable scope after the target (kept movable nodes + new nodes)
    status: str
    seconds: float
    improved: bool  # strictly cheaper than today


@dataclass
class Step:
    remove: list[str]
    launches: dict[int, int]
    saving: float
    status: str
    seconds: float


@dataclass
class _Model:
    """Columns and rows for one highspy model, built in plain lists."""

    cost: list[float] = field(default_factory=list)
    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    integer: list[int] = field(default_factory=list)
    row_lower: list[float] = field(default_factory=list)
    row_upper: list[float] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    index: list[int] = field(default_factory=list)
    value: list[float] = field(default_factory=list)

    def col(self, cost: float, lower: float = 0.0, upper: float = math.inf, integer: bool = False) -> int:
        self.cost.append(cost)
        self.lower.append(lower)
        self.upper.append(upper)
        if integer:
            self.integer.append(len(self.cost) - 1)
        return len(self.cost) - 1

    def row(self, terms: Iterable[tuple[int, float]], lower: float, upper: float) -> None:
        merged: dict[int, float] = {}
        for col, coef in terms:
            if coef:
                merged[col] = merged.get(col, 0.0) + coef
        self.starts.append(len(self.index))
        self.index.extend(merged)
        self.value.extend(merged.values())
        self.row_lower.append(lower)
        self.row_upper.append(upper)

    def solve(
        self, sense_max: bool, time_limit: float, start: Sequence[float] | None
    ) -> tuple[list[float] | None, str]:
        h = new_highs()
        h.setOptionValue("time_limit", max(time_limit, 0.01))
        h.setOptionValue("mip_rel_gap", 0.002)
        h.setOptionValue("threads", 1)
        h.setOptionValue("random_seed", 0)
        inf = highspy.kHighsInf
        n = len(self.cost)
        h.addVars(n, np.array(self.lower), np.array([u if u != math.inf else inf for u in self.upper]))
        h.changeColsCost(n, np.arange(n, dtype=np.int32), np.array(self.cost))
        if self.integer:
            idx = np.array(self.integer, dtype=np.int32)
            kinds = np.array([highspy.HighsVarType.kInteger] * len(idx))
            h.changeColsIntegrality(len(idx), idx, kinds)
        if self.row_lower:
            h.addRows(
                len(self.row_lower),
                np.array([v if v != -math.inf else -inf for v in self.row_lower]),
                np.array([v if v != math.inf else inf for v in self.row_upper]),
                len(self.index),
                np.array(self.starts, dtype=np.int32),
                np.array(self.index, dtype=np.int32),
                np.array(self.value),
            )
        h.changeObjectiveSense(highspy.ObjSense.kMaximize if sense_max else highspy.ObjSense.kMinimize)
        if start is not None:
            solution = highspy.HighsSolution()
            solution.col_value = list(start)
            solution.value_valid = True
            h.setSolution(solution)
        h.run()
        status = h.modelStatusToString(h.getModelStatus())
        if h.getInfo().primal_solution_status != 2:  # kSolutionStatusFeasible
            return None, status
        return list(h.getSolution().col_value), status


_BANNER_LOCK = threading.Lock()
_BANNER_DONE = False


def new_highs() -> highspy.Highs:
    """A silent HiGHS instance. The library prints a banner on stdout the first time one is made in a
    process, which would corrupt `karpflow plan -o json`: the first one is made with stdout closed."""
    global _BANNER_DONE
    with _BANNER_LOCK:
        if not _BANNER_DONE:
            sys.stdout.flush()
            saved = os.dup(1)
            try:
                with open(os.devnull, "w") as devnull:
                    os.dup2(devnull.fileno(), 1)
                    h = highspy.Highs()
            finally:
                os.dup2(saved, 1)
                os.close(saved)
            _BANNER_DONE = True
        else:
            h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    return h


def _scales(problem: FleetProblem) -> list[float]:
    """Per resource, a divisor that brings coefficients near 1 (memory is in bytes)."""
    out = []
    for d in range(len(problem.dims)):
        biggest = max([o.alloc[d] for o in problem.options] + [r.free[d] for r in problem.rooms] + [1])
        out.append(float(max(biggest, 1)))
    return out


def _classes(rooms: Iterable[Room]) -> dict[frozenset[int], list[Room]]:
    out: dict[frozenset[int], list[Room]] = {}
    for room in rooms:
        if room.admits:
            out.setdefault(room.admits, []).append(room)
    return out


def _placement_rows(
    m: _Model,
    problem: FleetProblem,
    classes: dict[frozenset[int], list[Room]],
    room_cols: dict[str, int],
    option_cols: dict[int, int],
    scales: list[float],
    exact_rooms: bool = False,
) -> dict[int, list[tuple[int, float]]]:
    """Flow columns and capacity rows; returns, per group, its flow columns (for conservation)."""
    flows: dict[int, list[tuple[int, float]]] = {g.index: [] for g in problem.groups}
    # Room is pooled per class of nodes admitting the same pods (a per-node program is several times
    # slower to solve well); a fragment smaller than half a typical pod counts for nothing, and what
    # pooling still overstates the simulation catches (moves.py).
    # With `exact_rooms` (the step: no keep decision on these nodes) every node has its own rows and
    # whole pods, so fragments count exactly as the pods' shapes allow.
    fragment = [0.0] * len(problem.dims) if exact_rooms else _typical_pod(problem)
    units = (
        [(a, [r]) for a, rooms in classes.items() for r in rooms] if exact_rooms else list(classes.items())
    )
    for admits, rooms in units:
        cols = {g: m.col(0.0, integer=exact_rooms) for g in sorted(admits)}
        for g, col in cols.items():
            flows[g].append((col, 1.0))
        for d, scale in enumerate(scales):
            usable = {r.name: max(r.free[d] - fragment[d] / 2, 0) / scale for r in rooms}
            fixed_room = sum(v for n, v in usable.items() if n not in room_cols)
            terms = [(col, problem.groups[g].vec[d] / scale) for g, col in cols.items()]
            terms += [(room_cols[n], -v) for n, v in usable.items() if n in room_cols]
            m.row(terms, -math.inf, fixed_room)
    for o, n_col in option_cols.items():
        option = problem.options[o]
        cols = {g: m.col(0.0) for g in sorted(option.admits)}
        for g, col in cols.items():
            flows[g].append((col, 1.0))
        for d, scale in enumerate(scales):
            terms = [(col, problem.groups[g].vec[d] / scale) for g, col in cols.items()]
            terms.append((n_col, -option.alloc[d] / scale))
            m.row(terms, -math.inf, 0.0)
    return flows


def _typical_pod(problem: FleetProblem) -> list[float]:
    count = sum(g.count for g in problem.groups)
    if not count:
        return [0.0] * len(problem.dims)
    return [sum(g.vec[d] * g.count for g in problem.groups) / count for d in range(len(problem.dims))]


def _launch_bound(problem: FleetProblem, o: int) -> int:
    """New nodes of an option that could ever be useful: enough to hold every movable pod."""
    option = problem.options[o]
    need = problem.demand()
    return max(
        (math.ceil(n / a) for n, a in zip(need, option.alloc, strict=True) if n > 0 and a > 0), default=0
    )


def solve_target(problem: FleetProblem, time_limit: float) -> TargetFleet:
    """The cheapest fleet for the movable scope (see the module docstring)."""
    began = time.perf_counter()
    movable = problem.movable
    current = problem.current_cost
    if not movable or (not problem.groups and not movable):
        return TargetFleet({r.name for r in movable}, [], {}, current, "nothing to move", 0.0, False)
    m = _Model()
    scales = _scales(problem)
    keep_cols = {}
    for r in movable:
        pods = sum(r.pods.values())
        keep_cols[r.name] = m.col(r.price - CHURN_PER_POD * pods, 0.0, 1.0, integer=True)
    option_cols = {
        o: m.col(option.price, 0.0, _launch_bound(problem, o), integer=True)
        for o, option in enumerate(problem.options)
    }
    flows = _placement_rows(m, problem, _classes(problem.rooms), keep_cols, option_cols, scales)
    for g in problem.groups:
        stays = [(keep_cols[node], float(len(pods))) for node, pods in g.per_node.items()]
        m.row([*flows[g.index], *stays], g.count, g.count)
    start = [0.0] * len(m.cost)
    for col in keep_cols.values():
        start[col] = 1.0  # today's fleet: nothing moves
    values, status = m.solve(False, time_limit, start)
    seconds = time.perf_counter() - began
    if values is None:
        return TargetFleet({r.name for r in movable}, [], {}, current, status, seconds, False)
    keep = {name for name, col in keep_cols.items() if values[col] > 0.5}
    launches = {o: round(values[col]) for o, col in option_cols.items() if round(values[col]) > 0}
    cost = sum(r.price for r in movable if r.name in keep) + sum(
        problem.options[o].price * n for o, n in launches.items()
    )
    remove = [r.name for r in movable if r.name not in keep]
    return TargetFleet(keep, remove, launches, cost, status, seconds, cost < current - _EPS)


def solve_step(
    problem: FleetProblem,
    target: TargetFleet,
    budgets: dict[str, int],
    pdb_pods: dict[str, dict[str, int]],
    pdb_allowed: dict[str, int],
    spot_to_spot: bool,
    time_limit: float,
) -> Step:
    """What to do this pass: which of the target's removals to start and which of its launches they
    need, the most saving first (see the module docstring). `pdb_pods`: node -> PDB -> pods of it."""
    began = time.perf_counter()
    leaving = set(target.remove)
    removable = [r for r in problem.movable if r.name in leaving and r.pods]
    if not removable:
        return Step([], {}, 0.0, "nothing to remove", 0.0)
    m = _Model()
    scales = _scales(problem)
    # Progress first: the most of the target's removals the budgets allow, as long as the step
    # saves; launches are priced a little so that no node is launched for nothing.
    go_cols = {r.name: m.col(r.price, 0.0, 1.0, integer=True) for r in removable}
    option_cols = {
        o: m.col(-LAUNCH_WEIGHT * problem.options[o].price, 0.0, float(n), integer=True)
        for o, n in target.launches.items()
    }
    staying = [r for r in problem.rooms if r.name not in leaving]
    classes = _classes(r for r in staying)
    exact = sum(len(r.admits) for r in staying) <= EXACT_ROOM_COLUMNS
    flows = _placement_rows(m, problem, classes, {}, option_cols, scales, exact_rooms=exact)
    by_name = {r.name: r for r in removable}
    for g in problem.groups:
        moved = [(go_cols[node], -float(len(pods))) for node, pods in g.per_node.items() if node in go_cols]
        m.row([*flows[g.index], *moved], 0.0, 0.0)
    pools: dict[str, list[int]] = {}
    for r in removable:
        assert r.candidate is not None
        pools.setdefault(r.candidate.pool_name, []).append(go_cols[r.name])
    for pool, cols in pools.items():
        m.row(((c, 1.0) for c in cols), -math.inf, float(budgets.get(pool, 0)))
    for pdb, allowed in pdb_allowed.items():
        counts = {n: per[pdb] for n, per in pdb_pods.items() if pdb in per and n in go_cols}
        if len(counts) > 1:
            m.row(
                ((go_cols[n], float(c)) for n, c in counts.items()),
                -math.inf,
                float(max(allowed, *counts.values())),
            )
    # Strictly cheaper now, as every consolidation command: the fleet's cost falls with each step.
    saving = [(go_cols[r.name], r.price) for r in removable]
    saving += [(c, -problem.options[o].price) for o, c in option_cols.items()]
    m.row(saving, MIN_STEP_SAVING, math.inf)
    if not spot_to_spot and option_cols:
        # Karpenter's rule: spot nodes alone may only be deleted, never replaced (behaviour notes §2.5).
        on_demand = [
            go_cols[r.name] for r in removable if r.candidate and r.candidate.capacity_type != CAPACITY_SPOT
        ]
        big = float(sum(target.launches.values()))
        m.row([*((c, 1.0) for c in option_cols.values()), *((c, -big) for c in on_demand)], -math.inf, 0.0)
    values, status = m.solve(True, time_limit, [0.0] * len(m.cost))
    seconds = time.perf_counter() - began
    if values is None:
        return Step([], {}, 0.0, status, seconds)
    remove = [r.name for r in removable if values[go_cols[r.name]] > 0.5]
    launches = {o: round(values[col]) for o, col in option_cols.items() if round(values[col]) > 0}
    saving = sum(by_name[n].price for n in remove) - sum(
        problem.options[o].price * k for o, k in launches.items()
    )
    return Step(remove, launches, saving, status, seconds)


def fluid_optimum(problem: FleetProblem, time_limit: float = 1.0) -> float | None:
    """The cheapest fractional mix of launch options covering the movable scope's demand (an LP)."""
    need = problem.demand()
    if not problem.options or not any(need):
        return None
    m = _Model()
    scales = _scales(problem)
    cols = [m.col(o.price) for o in problem.options]
    for d, scale in enumerate(scales):
        if need[d] > 0:
            m.row(
                ((c, o.alloc[d] / scale) for c, o in zip(cols, problem.options, strict=True)),
                need[d] / scale,
                math.inf,
            )
    values, _ = m.solve(False, time_limit, None)
    if values is None:
        return None
    return sum(o.price * v for o, v in zip(problem.options, values, strict=True))


__all__ = ["CHURN_PER_POD", "Step", "TargetFleet", "fluid_optimum", "new_highs", "solve_step", "solve_target"]
