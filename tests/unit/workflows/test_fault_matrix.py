"""The fault matrix (issue 30): every workflow, every activity or child it calls, every fault, each
cell on the time-skipping server against its expected outcome (fault_matrix.py), plus the checks
that keep the matrix whole: each workflow's declared activities are the ones its code calls, each is
registered on the worker, each is reached by a path, and docs/fault-matrix.md is the table the
cells are checked against."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from runtime.connections import ensure_search_attributes, with_karpflow_converter
from tests.unit.workflows.fault_injection import Fault
from tests.unit.workflows.fault_matrix import (
    COMPLETED,
    HEARTBEATS,
    RUNNING,
    Cell,
    cells,
    markdown,
    unreached,
    workflow_modules,
    workflow_name,
)
from tests.unit.workflows.fault_runner import replay, run_cell, shorten_time
from worker import WORKFLOWS
from workflows.disruption import DisruptionWorkflow

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "fault-matrix.md"
TABLE_START, TABLE_END = "<!-- fault-matrix:start -->", "<!-- fault-matrix:end -->"
ACTIVITY_CLASSES = {
    "KubernetesActivities",
    "EC2Activities",
    "NodeClaimActivities",
    "RolloutActivities",
    "PlanningActivities",
    "EventActivities",
    "WaitingCommandActivities",
    "NotificationActivities",
}


# -- the lists the cells come from ---------------------------------------------------------------------


@functools.cache  # asked once per attribute of worker.py's activities_for: ~20 s of parsing uncached
def defined_activities() -> frozenset[str]:
    """Every `@activity.defn(name=...)` under activities/."""
    names = set()
    for source in (ROOT / "activities").glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "defn":
                for keyword in node.keywords:
                    if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                        names.add(str(keyword.value.value))
    return frozenset(names)


def registered_activities() -> set[str]:
    """The method names worker.activities_for puts on the worker."""
    source = (ROOT / "worker.py").read_text()
    tree = ast.parse(source)
    function = next(
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "activities_for"
    )
    defined = defined_activities()
    return {n.attr for n in ast.walk(function) if isinstance(n, ast.Attribute) and n.attr in defined}


def called_by(workflow: type) -> set[str]:
    """What the workflow's modules (its class's and its parts') call: activity methods of the
    activity classes, activity names as strings, and `record_event` through workflows/events.py; the
    child workflows it starts."""
    trees = []
    for module in workflow_modules(workflow):
        assert module.__file__
        trees.append(ast.parse(Path(module.__file__).read_text()))
    defined = defined_activities()
    workflows = {workflow_name(w) for w in WORKFLOWS}
    found = set()
    for node in (node for tree in trees for node in ast.walk(tree)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id in ACTIVITY_CLASSES:
                found.add(node.attr)
            if node.attr == "run" and node.value.id in {w.__name__ for w in WORKFLOWS}:
                found.add(node.value.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in defined or node.value in workflows:
                found.add(node.value)
        elif isinstance(node, ast.ImportFrom) and node.module == "workflows.events":
            found.add("record_event")
        elif isinstance(node, ast.ImportFrom) and node.module == "workflows.notify":
            found.add("NotificationWorkflow")  # `notify(...)` starts it
    return found - {workflow_name(workflow)}


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=workflow_name)
def test_each_workflow_declares_what_its_code_calls(workflow: type) -> None:
    declared = set(workflow.ACTIVITIES) | set(workflow.CHILDREN)
    assert len(workflow.ACTIVITIES) == len(set(workflow.ACTIVITIES))
    assert called_by(workflow) == declared


def test_a_workflows_code_is_its_module_and_the_parts_it_inherits() -> None:
    """DisruptionWorkflow's code is spread over the parts it inherits: the check above reads them
    all, so an activity only a part calls (the approval's check, the compensation's listing) is
    found, and one a part calls without the list naming it fails the check."""
    modules = [m.__name__ for m in workflow_modules(DisruptionWorkflow)]
    assert modules[0] == "workflows.disruption"
    parts = {
        "workflows.disruption_approval",
        "workflows.disruption_replacements",
        "workflows.disruption_rollback",
    }
    assert parts <= set(modules)


def test_every_activity_is_registered_and_called_by_a_workflow() -> None:
    called = {a for w in WORKFLOWS for a in w.ACTIVITIES}
    assert registered_activities() == defined_activities() == called


def test_every_activity_and_child_is_reached_by_a_path() -> None:
    assert unreached() == []


def test_the_docs_table_is_the_matrix() -> None:
    text = DOC.read_text()
    table = text.split(TABLE_START)[1].split(TABLE_END)[0].strip("\n") + "\n"
    assert table == markdown(), "regenerate: python -m tests.unit.workflows.fault_matrix"


# -- the cells -------------------------------------------------------------------------------------------


MATRIX = cells()
# The time-skipping server never tells a parent that its child was terminated (it reports a timeout
# instead): those cells run on the real dev server.
ON_THE_DEV_SERVER = [c for c in MATRIX if c.fault == Fault.CHILD_TERMINATED]
ON_THE_TEST_SERVER = [c for c in MATRIX if c.fault != Fault.CHILD_TERMINATED]


@pytest.mark.parametrize("cell", ON_THE_TEST_SERVER, ids=lambda c: c.id)
async def test_cell(cell: Cell, time_skipping_env, ts_client, monkeypatch: pytest.MonkeyPatch) -> None:
    await check(cell, time_skipping_env, ts_client, monkeypatch)


@pytest.mark.parametrize("cell", ON_THE_DEV_SERVER, ids=lambda c: c.id)
async def test_cell_on_the_dev_server(cell: Cell, dev_server_env, monkeypatch: pytest.MonkeyPatch) -> None:
    client = with_karpflow_converter(dev_server_env.client)
    assert await ensure_search_attributes(client)
    await check(cell, dev_server_env, client, monkeypatch)


async def check(
    cell: Cell, env: WorkflowEnvironment, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    shorten_time(monkeypatch)
    expected = cell.expected
    seen = await run_cell(env, client, cell)

    assert seen.task_failures == [], seen.task_failures
    if expected.status == RUNNING:  # the controller went on; the cell stopped it
        assert seen.status == COMPLETED
        failing = cell.fault.name in ("PERMANENT", "EXHAUSTED") and not expected.note.endswith("logged only")
        assert (cell.activity in seen.message) == failing, seen.message
    else:
        assert (seen.status, seen.phase) == (expected.status, expected.phase), seen.message
        assert (seen.phase_attribute or "") == expected.phase  # what the Web UI lists it by
    assert set(seen.left) == expected.left, seen.left
    assert seen.waited_in == expected.waits
    if not cell.is_child:
        beats = (workflow_name(cell.path.workflow), cell.target) in HEARTBEATS
        assert (seen.armed.heartbeat_timeouts[0] is not None) == beats, seen.armed.heartbeat_timeouts
    await replay(seen.histories)
