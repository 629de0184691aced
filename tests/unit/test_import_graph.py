"""The product's modules import one way: no cycles, and activities/ does not reach into the planner
except the controller's planning activities (which run it).

Built from the source with `ast` (imports inside functions count too: a lazy import is still a
dependency), over every package and sub-package of the product.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("activities", "api", "cluster", "kube", "launch", "planner", "runtime", "workflows")


def modules() -> dict[str, Path]:
    found = {p.stem: ROOT / p for p in (Path("worker.py"), Path("cli.py"))}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    edges: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            edges[name].update(t for t in targets if t in known and t != name)
    return edges


def strongly_connected(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """Tarjan's algorithm: the groups of modules that reach each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(frozenset(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return groups


def test_no_import_cycles():
    assert [sorted(group) for group in strongly_connected(graph())] == []


def test_the_graph_sees_sub_packages():
    edges = graph()
    assert "planner.scheduling.packing" in edges["planner.scheduling.new_nodes"]


# The operator's controls are read by one definition: the guards at the moment of acting read
# MaintenanceWindows, NodeDisruptionBudgets and rate budgets exactly as the planner does (leaf modules
# that import only api/, kube/ and each other).
SHARED_RULES = ("planner.maintenance_windows", "planner.node_disruption_budgets", "planner.rate_budgets")


def test_activities_and_workflows_do_not_depend_on_the_planner():
    """The planner decides; only the controller's planning activities run it (with their housekeeping,
    which writes the annotations and leaving taints a pass planned, pass_report, which turns the
    pass's Plan into Events and gauges, and waiting_commands, which judges a command that waited for
    approval again, and capacity_reservations, which reads the EC2NodeClasses' reservations for the
    pass's catalog), the interruption handler reads the budget rule before a proactive (rebalance)
    replacement, and the informer cache feeds the planner's snapshot builder with its events (the
    pass is incremental)."""
    edges = graph()
    leaks = sorted(
        (name, target)
        for name, targets in edges.items()
        if name.startswith(("activities.", "workflows.", "kube.", "api.", "cluster."))
        and name
        not in (
            "activities.planning",
            "activities.controller_housekeeping",
            "activities.pass_report",
            "activities.waiting_commands",
            "activities.capacity_reservations",
            "cluster.interruption",
            "cluster.informer",
        )
        for target in targets
        if target.startswith("planner") and target not in SHARED_RULES
    )
    assert leaks == []


def test_the_shared_control_rules_stay_leaves():
    edges = graph()
    for name in SHARED_RULES:
        outside = [t for t in edges[name] if t not in SHARED_RULES]
        assert not [t for t in outside if t.startswith(("planner", "activities", "workflows"))], name
