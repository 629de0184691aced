"""The mixed-integer programs behind Optimal consolidation, solved with HiGHS (highspy).

Why HiGHS: a small self-contained wheel (numpy its only dependency; OR-Tools pins protobuf, which
the Temporal SDK also pins), a deterministic branch-and-bound (the same snapshot gives the same plan
when it finishes in time), a time limit it always honours, and a MIP start: today's fleet is always a
feasible answer, so the target returns something at least as good whenever it stops. The models are
small by construction (pods grouped by shape and placement rules), so 1,000 nodes are a few thousand
columns.

Three programs (planner/optimal/__init__.py tells how they fit together):

**Target fleet.** y_i in {0,1}: keep movable node i; n_o integer: new nodes of launch option o;
x >= 0: pods of group g moved into the room of a kept node (per node when the scope is small, else
pooled per class of nodes admitting the same pods) or onto the new nodes of an option.
    min  sum_i (price_i - churn * pods_i) y_i + sum_o price_o n_o
    s.t. sum x_g. + sum_i pods_gi y_i = pods_g                       (every pod has a place)
         sum_g x_gi req_gd <= free_id y_i      (per kept node; pooled: per class, fixed room added)
         sum_g x_go req_gd <= alloc_od n_o                           (new nodes, per resource)
         sum_{i in p} cap_id y_i + sum_{o in p} cap_od n_o <= limit_pd - fixed_pd   (spec.limits)
`churn` prices a moved pod at a share of the fleet's fluid optimum spread over its pods
(`PlanOptions.optimal_churn_share`): a node is only removed when that saves more than its pods'
churn. A held plan re-solves this with its removals fixed (only the launches are free, and room is
counted node by node: a linear program but for the launches). When room was pooled, the launches
are solved again that way before the layout.

**Layout**: the target made whole, node by node. Integer pods of each moving group per destination:
every room that stays, each planned new node (open_k in {0,1}, at its price) and spares (one per
option, and a quarter more of the planned ones). min sum price_k open_k, s.t. per node and resource
the pods fit, and every moving pod has a destination. It starts from a first fit that follows the
target's flows (then biggest pods first), and is that first fit alone when too big to improve within
a pass. The simulation then places each pod
where the layout says when every rule allows it (planner/optimal/layout.py).

**This pass's step** on the layout: z_i in {0,1}: remove leaving node i now; w_k in {0,1}: launch new
node k now.
    max  sum_i (BIG + price_i) z_i - sum_k price_k w_k     (progress first, then saving now)
    s.t. w_k >= z_i when a pod of i goes to k;  sum_{i in pool p} z_i <= budget_p;
         pods of a PDB evicted <= its allowance (one node always may go);
         ledger + sum_k price_k w_k - sum_i price_i z_i <= 0   (the plan never costs more than it saved)
         with spot-to-spot off: no launch unless an on-demand node goes.

Plus the **fluid optimum** (an LP): the cheapest fractional mix of launch options covering the movable
scope's total requests, the yardstick `karpflow plan --strategy optimal` prints.
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

from planner.optimal.fleet import FleetProblem, Room

_EPS = 1e-6
# Relative optimality gap at which a program stops: 1 % of a fleet's cost is within what a pass's
# churn weighting and the simulation's whole pods move anyway, and the search stops far sooner.
MIP_GAP = 0.01
FRAGMENT = 1.0
# Kept nodes get their own rows in the target while the scope has at most this many (node, group)
# columns; past it their room is pooled per class (faster, but it overstates fragmented room).
EXACT_ROOM_COLUMNS = 3000
# Spare new nodes per launch option the layout may open when the target's do not hold the pods.
LAYOUT_SPARES = 1
# Rooms that stay, at most, in the layout (the roomiest first); pods beyond are placed by the simulation.
LAYOUT_ROOMS = 400
# Past this many integer columns the layout is first fit's, unimproved (the program would not
# improve it within a pass).
LAYOUT_MIP_COLUMNS = 1000


@dataclass
class TargetFleet:
    keep: set[str]  # movable nodes kept
    remove: list[str]  # movable nodes removed, in the problem's order
    launches: dict[int, int]  # option index -> count
    cost: float  # $/h of the movable scope after the target (kept movable nodes + new nodes)
    status: str
    seconds: float
    improved: bool  # strictly cheaper than today
    exact: bool = True  # kept nodes had their own rows (else their room was pooled, and overstated)
    found: bool = True  # False: the program had no answer when it stopped (today's fleet is reported)
    # The target's (fractional) flows: pods of each group into each kept node's room (when counted node
    # by node) and onto each launch option's new nodes. The layout starts from them.
    room_flows: dict[str, dict[int, float]] = field(default_factory=dict)
    option_flows: dict[int, dict[int, float]] = field(default_factory=dict)


@dataclass
class Layout:
    """Where the moving pods go, node by node: per destination, pods per group."""

    rooms: dict[str, dict[int, int]]  # staying node -> group -> pods
    new: list[tuple[int, dict[int, int]]]  # (option index, group -> pods) per new node
    status: str
    seconds: float


@dataclass
class StepNode:
    """A leaving node as the step sees it."""

    name: str
    price: float
    pool: str
    spot: bool
    needs: set[int]  # new nodes (layout indices) its pods go to
    pdb_pods: dict[str, int] = field(default_factory=dict)


@dataclass
class Step:
    remove: list[str]
    launches: list[int]  # new nodes (layout indices) launched now
    saving: float  # $/h saved now (launches at their worst-case price); may be < 0 within a plan
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
        h.setOptionValue("mip_rel_gap", MIP_GAP)
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
    """A silent, single-threaded HiGHS instance. The library prints a banner on stdout the first time
    one is made in a process, which would corrupt `karpflow plan -o json`: the first one is made with
    stdout closed."""
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
    # HiGHS's thread pool is global: the first instance of a process fixes its size, and an instance
    # asking for another size then fails to run. Every instance here asks for one.
    h.setOptionValue("threads", 1)
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


def churn_per_pod(problem: FleetProblem, share: float) -> float:
    """$/h a moved pod is charged in the target: moving every pod of the scope costs `share` of its
    fluid optimum (`PlanOptions.optimal_churn_share`)."""
    pods = sum(g.count for g in problem.groups)
    fluid = fluid_optimum(problem)
    if not pods or fluid is None:
        return 0.0
    return share * fluid / pods


def solve_target(
    problem: FleetProblem, time_limit: float, removals: Sequence[str] | None = None, churn: float = 0.0
) -> TargetFleet:
    """The cheapest fleet for the movable scope, each moved pod charged `churn` $/h (see the module
    docstring). With `removals` (a held plan) the keep decisions are fixed: those nodes go, every
    other one stays; only launches are solved."""
    began = time.perf_counter()
    movable = problem.movable
    current = problem.current_cost
    if not movable:
        return TargetFleet(set(), [], {}, current, "nothing to move", 0.0, False)
    fixed = set(removals) if removals is not None else None
    m = _Model()
    scales = _scales(problem)
    keep_cols = {}
    for r in movable:
        bound = (0.0, 1.0) if fixed is None else ((0.0, 0.0) if r.name in fixed else (1.0, 1.0))
        keep_cols[r.name] = m.col(r.price - churn * sum(r.pods.values()), *bound, integer=True)
    option_cols = {
        o: m.col(option.price, 0.0, _launch_bound(problem, o), integer=True)
        for o, option in enumerate(problem.options)
    }
    fragment = [f * FRAGMENT for f in _typical_pod(problem)]
    flows: dict[int, list[tuple[int, float]]] = {g.index: [] for g in problem.groups}
    # With the removals fixed no keep decision is left: room per node costs a linear program only.
    exact = fixed is not None or sum(len(r.admits) for r in movable) <= EXACT_ROOM_COLUMNS
    # Room on nodes that stay whatever is decided: pooled per class (they are not decided on).
    pooled = [r for r in problem.rooms if not r.movable or not exact]
    for admits, rooms in _classes(pooled).items():
        _room_rows(m, problem, flows, admits, rooms, keep_cols, scales, fragment)
    room_flow_cols: dict[str, dict[int, int]] = {}
    if exact:
        for r in movable:
            if r.admits:
                room_flow_cols[r.name] = _room_rows(
                    m, problem, flows, r.admits, [r], keep_cols, scales, fragment
                )
    option_flow_cols: dict[int, dict[int, int]] = {}
    for o, n_col in option_cols.items():
        option = problem.options[o]
        cols = option_flow_cols[o] = {g: m.col(0.0) for g in sorted(option.admits)}
        for g, col in cols.items():
            flows[g].append((col, 1.0))
        for d, scale in enumerate(scales):
            terms = [(col, problem.groups[g].vec[d] / scale) for g, col in cols.items()]
            terms.append((n_col, -option.alloc[d] / scale))
            m.row(terms, -math.inf, 0.0)
    for group in problem.groups:
        stays = [(keep_cols[node], float(len(pods))) for node, pods in group.per_node.items()]
        m.row([*flows[group.index], *stays], group.count, group.count)
    _limit_rows(m, problem, keep_cols, option_cols)
    start = None
    if fixed is None:
        start = [0.0] * len(m.cost)
        for col in keep_cols.values():
            start[col] = 1.0  # today's fleet: nothing moves
    values, status = m.solve(False, time_limit, start)
    seconds = time.perf_counter() - began
    if values is None:
        return TargetFleet({r.name for r in movable}, [], {}, current, status, seconds, False, exact, False)
    keep = {name for name, col in keep_cols.items() if values[col] > 0.5}
    launches = {o: round(values[col]) for o, col in option_cols.items() if round(values[col]) > 0}
    cost = sum(r.price for r in movable if r.name in keep) + sum(
        problem.options[o].price * n for o, n in launches.items()
    )
    remove = [r.name for r in movable if r.name not in keep]
    target = TargetFleet(keep, remove, launches, cost, status, seconds, cost < current - _EPS, exact)
    target.room_flows = {
        name: {g: values[c] for g, c in cols.items() if values[c] > _EPS}
        for name, cols in room_flow_cols.items()
        if name in keep
    }
    target.option_flows = {
        o: {g: values[c] for g, c in cols.items() if values[c] > _EPS}
        for o, cols in option_flow_cols.items()
        if o in launches
    }
    return target


def _limit_rows(
    m: _Model, problem: FleetProblem, keep_cols: dict[str, int], option_cols: dict[int, int]
) -> None:
    """NodePool spec.limits: kept capacity plus launched capacity within what the pool's other nodes
    leave (planner/limits.py `PoolLimit`); a pool over its limits already launches nothing."""
    for limit in problem.limits:
        launches = [(option_cols[o], v) for o, v in limit.options.items() if o in option_cols and v]
        if limit.launches_only:
            if launches:
                m.row(launches, -math.inf, 0.0)
            continue
        kept = [(keep_cols[n], v) for n, v in limit.nodes.items() if n in keep_cols and v]
        if kept or launches:
            # Bytes of memory are ~1e10: scaled, so the row is as well conditioned as the others.
            scale = max([abs(limit.bound), 1.0, *(v for _, v in kept), *(v for _, v in launches)])
            terms = [(col, v / scale) for col, v in (*kept, *launches)]
            m.row(terms, -math.inf, limit.bound / scale)


def _room_rows(
    m: _Model,
    problem: FleetProblem,
    flows: dict[int, list[tuple[int, float]]],
    admits: frozenset[int],
    rooms: list[Room],
    keep_cols: dict[str, int],
    scales: list[float],
    fragment: list[float],
) -> dict[int, int]:
    """Flow columns into the room of `rooms` and one capacity row per resource: the fixed room plus
    the room of those kept. Half a typical pod per node counts for nothing (pods are whole)."""
    cols = {g: m.col(0.0) for g in sorted(admits)}
    for g, col in cols.items():
        flows[g].append((col, 1.0))
    for d, scale in enumerate(scales):
        usable = {r.name: max(r.free[d] - fragment[d] / 2, 0) / scale for r in rooms}
        fixed_room = sum(v for n, v in usable.items() if n not in keep_cols)
        terms = [(col, problem.groups[g].vec[d] / scale) for g, col in cols.items()]
        terms += [(keep_cols[n], -v) for n, v in usable.items() if n in keep_cols]
        m.row(terms, -math.inf, fixed_room)
    return cols


def solve_layout(
    problem: FleetProblem,
    removals: Sequence[str],
    launches: dict[int, int],
    time_limit: float,
    guide: TargetFleet | None = None,
) -> Layout | None:
    """The target made whole: which staying room or new node each moving pod goes to (see the module
    docstring). Started from a first-fit layout that follows the target's flows (`guide`), so it has
    an answer whenever first fit finds one; None when neither finds one."""
    began = time.perf_counter()
    gone = set(removals)
    moving: dict[int, int] = {}
    for group in problem.groups:
        count = sum(len(p) for n, p in group.per_node.items() if n in gone)
        if count:
            moving[group.index] = count
    if not moving:
        return Layout({}, [], "nothing to move", 0.0)
    scales = _scales(problem)
    smallest = [min(problem.groups[g].vec[d] for g in moving) for d in range(len(problem.dims))]
    rooms = [
        r
        for r in problem.rooms
        if r.name not in gone
        and r.admits & moving.keys()
        and all(f >= s for f, s in zip(r.free, smallest, strict=True))
    ]
    rooms = sorted(rooms, key=lambda r: (-sum(f / s for f, s in zip(r.free, scales, strict=True)), r.name))
    rooms = sorted(rooms[:LAYOUT_ROOMS], key=lambda r: r.name)
    m = _Model()
    dests: list[_Dest] = []
    flows: dict[int, list[tuple[int, float]]] = {g: [] for g in moving}
    for r in rooms:
        cols = {g: m.col(0.0, integer=True) for g in sorted(r.admits & moving.keys())}
        dests.append(_Dest(r.name, None, None, cols, r.free))
        for d, scale in enumerate(scales):
            terms = [(col, problem.groups[g].vec[d] / scale) for g, col in cols.items()]
            m.row(terms, -math.inf, r.free[d] / scale)
    for o, option in enumerate(problem.options):
        groups = sorted(option.admits & moving.keys())
        if not groups:
            continue
        previous = None
        planned = launches.get(o, 0)
        for copy in range(planned + LAYOUT_SPARES + planned // 4):
            open_col = m.col(option.price, 0.0, 1.0, integer=True)
            cols = {g: m.col(0.0, integer=True) for g in groups}
            dests.append(_Dest(None, o, open_col, cols, option.alloc, spare=copy >= planned))
            for d, scale in enumerate(scales):
                terms = [(col, problem.groups[g].vec[d] / scale) for g, col in cols.items()]
                terms.append((open_col, -option.alloc[d] / scale))
                m.row(terms, -math.inf, 0.0)
            if previous is not None:
                m.row([(previous, 1.0), (open_col, -1.0)], 0.0, math.inf)  # copies open in order
            previous = open_col
    for dest in dests:
        for g, col in dest.cols.items():
            flows[g].append((col, 1.0))
    for g, count in moving.items():
        m.row(flows[g], count, count)
    start = _first_fit(problem, moving, dests, len(m.cost), guide)
    if len(m.integer) > LAYOUT_MIP_COLUMNS:
        # Too big to improve on first fit within a pass: first fit it is (or nothing).
        values, status = start, "first fit"
    else:
        values, status = m.solve(False, time_limit, start)
    seconds = time.perf_counter() - began
    if values is None:
        return None
    layout_rooms: dict[str, dict[int, int]] = {}
    new: list[tuple[int, dict[int, int]]] = []
    for dest in dests:
        counts = {g: round(values[c]) for g, c in dest.cols.items() if round(values[c]) > 0}
        if not counts:
            continue
        if dest.room is not None:
            layout_rooms[dest.room] = counts
        elif dest.open_col is not None and dest.option is not None and values[dest.open_col] > 0.5:
            new.append((dest.option, counts))
    return Layout(layout_rooms, new, status, seconds)


@dataclass
class _Dest:
    """A destination in the layout: a staying room, or a copy of a launch option (open or not)."""

    room: str | None
    option: int | None
    open_col: int | None
    cols: dict[int, int]  # group -> column of its pods here
    capacity: tuple[int, ...]
    spare: bool = False


def _first_fit(
    problem: FleetProblem,
    moving: dict[int, int],
    dests: list[_Dest],
    columns: int,
    guide: TargetFleet | None = None,
) -> list[float] | None:
    """A whole layout, the layout program's starting point (None if it fails):
    1. the target's flows, rounded down: pods of each group into the kept nodes' room it planned,
       then onto the new nodes of each option it planned, each pod on the copy with the most room
       left (the target mixes pod shapes per option so that both cpu and memory fill up);
    2. what is left, biggest pods first, first fit: staying rooms, the target's new nodes, spares
       cheapest per unit of room first."""
    start = [0.0] * columns
    left = {id(d): list(d.capacity) for d in dests}
    need = dict(moving)
    scales = _scales(problem)

    def size(vec: Sequence[float]) -> float:
        return sum(v / s for v, s in zip(vec, scales, strict=True))

    def put(dest: _Dest, g: int, count: int) -> int:
        """Up to `count` pods of group g on dest; how many went."""
        col = dest.cols.get(g)
        if col is None or count <= 0:
            return 0
        vec = problem.groups[g].vec
        room = left[id(dest)]
        take = min([count] + [r // v for r, v in zip(room, vec, strict=True) if v > 0])
        if take <= 0:
            return 0
        for d, v in enumerate(vec):
            room[d] -= take * v
        start[col] += take
        need[g] -= take
        if dest.open_col is not None:
            start[dest.open_col] = 1.0
        return take

    groups = sorted(moving, key=lambda g: size(problem.groups[g].vec), reverse=True)
    if guide is not None:
        for dest in dests:
            if dest.room is not None:
                for g, flow in guide.room_flows.get(dest.room, {}).items():
                    if g in need:
                        put(dest, g, min(need[g], math.floor(flow + _EPS)))
        copies: dict[int, list[_Dest]] = {}
        for dest in dests:
            if dest.option is not None and not dest.spare:
                copies.setdefault(dest.option, []).append(dest)
        for o, flows in guide.option_flows.items():
            for g in sorted(flows, key=lambda g: size(problem.groups[g].vec), reverse=True):
                budget = min(need.get(g, 0), math.floor(flows[g] + _EPS))
                for _ in range(budget):
                    roomiest = sorted(
                        copies.get(o, []),
                        key=lambda d: (
                            -min(r / c for r, c in zip(left[id(d)], d.capacity, strict=True) if c > 0)
                        ),
                    )
                    if not any(put(d, g, 1) for d in roomiest):
                        break
    spares = sorted(
        (d for d in dests if d.spare),
        key=lambda d: (
            problem.options[d.option].price / max(size(d.capacity), 1e-9) if d.option is not None else 0.0
        ),
    )
    order = [d for d in dests if not d.spare] + spares
    for g in groups:
        for dest in order:
            if need[g] == 0:
                break
            put(dest, g, need[g])
        if need[g]:
            return None
    # Copies of an option open in order (the program's symmetry rows): move the opened ones first.
    by_option: dict[int, list[_Dest]] = {}
    for dest in dests:
        if dest.option is not None:
            by_option.setdefault(dest.option, []).append(dest)
    for copies_of in by_option.values():
        opened = [d for d in copies_of if start[d.open_col or 0] > 0.5]
        closed = [d for d in copies_of if start[d.open_col or 0] <= 0.5]
        contents = [{g: start[c] for g, c in d.cols.items()} for d in opened]
        for dest in copies_of:
            assert dest.open_col is not None
            start[dest.open_col] = 0.0
            for c in dest.cols.values():
                start[c] = 0.0
        for dest, content in zip([*opened, *closed], contents, strict=False):
            assert dest.open_col is not None
            start[dest.open_col] = 1.0
            for g, value in content.items():
                start[dest.cols[g]] = value
    return start


def solve_step(
    nodes: Sequence[StepNode],
    new_prices: Sequence[float],
    budgets: dict[str, int],
    pdb_allowed: dict[str, int],
    ledger: float,
    spot_to_spot: bool,
    time_limit: float,
) -> Step:
    """What to do this pass (see the module docstring): which leaving nodes go now and which new nodes
    their pods need, as many as the budgets and PDBs allow while the plan's ledger stays <= 0."""
    began = time.perf_counter()
    if not nodes:
        return Step([], [], 0.0, "nothing to remove", 0.0)
    m = _Model()
    big = sum(n.price for n in nodes) + sum(new_prices) + 1.0
    go = {n.name: m.col(big + n.price, 0.0, 1.0, integer=True) for n in nodes}
    needed = sorted({k for n in nodes for k in n.needs})
    launch = {k: m.col(-new_prices[k], 0.0, 1.0, integer=True) for k in needed}
    for n in nodes:
        for k in n.needs:
            m.row([(launch[k], 1.0), (go[n.name], -1.0)], 0.0, math.inf)
    pools: dict[str, list[int]] = {}
    for n in nodes:
        pools.setdefault(n.pool, []).append(go[n.name])
    for pool, cols in pools.items():
        m.row(((c, 1.0) for c in cols), -math.inf, float(budgets.get(pool, 0)))
    for pdb, allowed in pdb_allowed.items():
        counts = {n.name: n.pdb_pods[pdb] for n in nodes if pdb in n.pdb_pods}
        if len(counts) > 1:
            m.row(
                ((go[name], float(c)) for name, c in counts.items()),
                -math.inf,
                float(max(allowed, *counts.values())),
            )
    # The plan never costs more than it has saved (planner/optimal/held.py).
    m.row(
        [*((launch[k], new_prices[k]) for k in needed), *((go[n.name], -n.price) for n in nodes)],
        -math.inf,
        -ledger + _EPS,
    )
    if not spot_to_spot and launch:
        # Karpenter's rule: spot nodes alone may only be deleted, never replaced (behaviour notes §2.5).
        on_demand = [go[n.name] for n in nodes if not n.spot]
        terms = [*((c, 1.0) for c in launch.values()), *((c, -float(len(launch))) for c in on_demand)]
        m.row(terms, -math.inf, 0.0)
    # At least one node, or the program says why not.
    m.row(((c, 1.0) for c in go.values()), 1.0, math.inf)
    values, status = m.solve(True, time_limit, None)
    seconds = time.perf_counter() - began
    if values is None:
        return Step([], [], 0.0, status, seconds)
    remove = [n.name for n in nodes if values[go[n.name]] > 0.5]
    launches = [k for k in needed if values[launch[k]] > 0.5]
    saving = sum(n.price for n in nodes if n.name in set(remove)) - sum(new_prices[k] for k in launches)
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


__all__ = [
    "Layout",
    "Step",
    "StepNode",
    "TargetFleet",
    "churn_per_pod",
    "fluid_optimum",
    "new_highs",
    "solve_layout",
    "solve_step",
    "solve_target",
]
