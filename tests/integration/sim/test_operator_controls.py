"""MaintenanceWindows and NodeDisruptionBudgets on the simulated cluster, through the real kubectl
and the real `karpflow` executable: the CRDs are installed, the schema refuses what it can say,
and `karpflow windows` / `karpflow plan --live` read the controls from the cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sim.invariants import InvariantBounds
from sim.stack import SimStack
from sim.testing import SMALL, assert_no_violations, kubectl

pytestmark = pytest.mark.integration

KARPFLOW = Path(sys.executable).parent / "karpflow"
PAUSE = """
apiVersion: karpflow.dev/v1alpha1
kind: MaintenanceWindow
metadata:
  name: pause-default
spec:
  actions: [Emptiness, Consolidation, Expiration]
  selector:
    - key: karpenter.sh/nodepool
      operator: In
      values: [default]
---
apiVersion: karpflow.dev/v1alpha1
kind: NodeDisruptionBudget
metadata:
  name: one-at-a-time
spec:
  selector:
    matchLabels:
      karpenter.sh/nodepool: default
  maxUnavailable: 1
"""


def karpflow(stack: SimStack, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(stack.kubeconfig_path), "COLUMNS": "200"}
    return subprocess.run([str(KARPFLOW), *args], capture_output=True, text=True, env=env, timeout=120)


def apply(stack: SimStack, text: str, tmp_path: Path, *, check: bool = True) -> str:
    path = tmp_path / "controls.yaml"
    path.write_text(text)
    return kubectl(stack, "apply", "-f", str(path), check=check)


@pytest.mark.sim_stack(scenario=SMALL)
def test_the_crds_answer_and_refuse_what_their_schema_says(sim_stack, tmp_path):
    listed = kubectl(
        sim_stack, "get", "crd", "maintenancewindows.karpflow.dev", "nodedisruptionbudgets.karpflow.dev"
    )
    assert "maintenancewindows.karpflow.dev" in listed and "nodedisruptionbudgets.karpflow.dev" in listed
    assert apply(sim_stack, PAUSE, tmp_path).splitlines() == [
        "maintenancewindow.karpflow.dev/pause-default created",
        "nodedisruptionbudget.karpflow.dev/one-at-a-time created",
    ]
    # The CRDs' additionalPrinterColumns, as kube-apiserver's table convertor prints them.
    windows, budgets = kubectl(sim_stack, "get", "mw,ndb").strip().split("\n\n")
    header, row = windows.splitlines()
    assert header.split() == ["NAME", "ACTIONS", "MODE", "SCHEDULES", "AGE"]
    assert row.split()[:2] == [
        "maintenancewindow.karpflow.dev/pause-default",
        '["Emptiness","Consolidation","Expiration"]',
    ]
    assert len(row.split()) == 3  # no mode, no schedule: empty cells, then the age
    header, row = budgets.splitlines()
    assert header.split() == ["NAME", "MIN", "AVAILABLE", "MAX", "UNAVAILABLE", "AGE"]
    assert row.split()[:2] == ["nodedisruptionbudget.karpflow.dev/one-at-a-time", "1"]
    explained = kubectl(sim_stack, "explain", "maintenancewindow.spec")
    assert "Which disruption actions the window blocks" in explained
    assert "What the window blocks. Interruption is never blocked" in explained
    result = subprocess.run(
        ["kubectl", "--kubeconfig", str(sim_stack.kubeconfig_path), "apply", "-f", "-"],
        input=PAUSE.replace("[Emptiness, Consolidation, Expiration]", "[Consolidaton]").replace(
            "pause-default", "typo"
        ),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0
    assert 'Unsupported value: "Consolidaton"' in result.stderr
    assert_no_violations(sim_stack)


TUESDAY_NIGHTS = """
apiVersion: karpflow.dev/v1alpha1
kind: MaintenanceWindow
metadata:
  name: tuesday-nights
spec:
  mode: Allow
  timeZone: Europe/Berlin
  schedules: [{cron: "0 2 * * 2", duration: 3h}]
  exclusions:
    - {start: "2026-12-22T00:00:00+01:00", end: "2027-01-04T00:00:00+01:00", reason: holidays}
  actions: [Drift]
"""


@pytest.mark.sim_stack(scenario=SMALL)
def test_an_allow_window_in_a_time_zone_is_stored_whole_and_reported_on_its_clock(sim_stack, tmp_path):
    """The emulator keeps the new fields (a structural schema prunes unknown ones) and refuses an
    exclusion that ends before it starts with the CRD rule's message."""
    apply(sim_stack, TUESDAY_NIGHTS, tmp_path)
    header, row = kubectl(sim_stack, "get", "mw", "tuesday-nights", "-o", "wide").splitlines()
    assert header.split() == ["NAME", "ACTIONS", "MODE", "SCHEDULES", "TIME", "ZONE", "AGE"]
    assert row.split()[1:8] == ['["Drift"]', "Allow", "0", "2", "*", "*", "2"]
    assert row.split()[8] == "Europe/Berlin"
    # Wednesday 2 December 2026, 12:00 UTC: blocked until Tuesday the 8th, 02:00 in Berlin.
    result = karpflow(sim_stack, "windows", "--at", "2026-12-02T12:00:00Z", "-o", "json")
    assert result.returncode == 0, result.stderr
    (window,) = json.loads(result.stdout)["windows"]
    assert (window["mode"], window["timeZone"], window["active"]) == ("Allow", "Europe/Berlin", True)
    assert (window["until"], window["untilLocal"]) == (
        "2026-12-08T01:00:00Z",
        "2026-12-08T02:00:00+01:00 CET",
    )
    assert window["exclusions"] == ["2026-12-21T23:00:00Z to 2027-01-03T23:00:00Z"]
    bad = subprocess.run(
        ["kubectl", "--kubeconfig", str(sim_stack.kubeconfig_path), "apply", "-f", "-"],
        input=TUESDAY_NIGHTS.replace("2027-01-04T00:00:00+01:00", "2026-12-01T00:00:00+01:00"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode != 0 and "end must be after start" in bad.stderr, bad.stderr


@pytest.mark.sim_stack(scenario=SMALL)
def test_karpflow_windows_and_plan_read_the_controls_of_the_live_cluster(sim_stack, tmp_path):
    apply(sim_stack, PAUSE, tmp_path)
    result = karpflow(sim_stack, "windows", "-o", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    (window,) = report["windows"]
    assert (window["name"], window["active"], window["nodes"]) == ("pause-default", True, 3)
    nodes = {n["metadata"]["name"] for n in sim_stack.store.list("nodes").items}
    assert {item["node"] for item in report["blocked"]} == nodes and len(nodes) == 3
    assert {b["action"] for item in report["blocked"] for b in item["blocked"]} == {
        "Emptiness",
        "Consolidation",
        "Expiration",
    }
    (budget,) = report["nodeDisruptionBudgets"]
    assert (budget["name"], budget["selected"], budget["remaining"]) == ("one-at-a-time", 3, 1)
    table = karpflow(sim_stack, "windows")
    assert table.returncode == 0 and "pause-default" in table.stdout and "one-at-a-time" in table.stdout

    # without the window, small.yaml's empty node is removed (emptiness); with it, nothing moves
    plan = json.loads(karpflow(sim_stack, "plan", "--live", "-o", "json").stdout)
    assert plan["commands"] == []
    reasons = sorted(b["reason"] for b in plan["blocked"])
    assert (
        "MaintenanceWindow pause-default blocks Emptiness until pause-default is deleted (no schedule)"
        in (reasons)
    )
    assert_no_violations(sim_stack)


@pytest.mark.sim_stack(scenario=None)
def test_karpflow_windows_refuses_a_cluster_without_nodes(sim_stack):
    result = karpflow(sim_stack, "windows")
    assert result.returncode == 2
    assert "has no nodes" in result.stderr


@pytest.mark.sim_stack(scenario=SMALL, invariant_bounds=InvariantBounds(window_min_wall=0))
def test_the_invariant_checker_judges_starts_against_the_windows_in_the_cluster(sim_stack, tmp_path):
    apply(sim_stack, PAUSE.replace("[Emptiness, Consolidation, Expiration]", "[Drift]"), tmp_path)
    node = sorted(n["metadata"]["name"] for n in sim_stack.store.list("nodes").items)[0]
    time.sleep(0.5)  # longer than the window's grace at this time scale
    # what a DisruptionWorkflow started by hand with reason Drifted does first (phase 2 refuses it)
    kubectl(
        sim_stack, "annotate", "node", node, "karpflow.io/disruption-command=disruption/default/Drifted/x@r"
    )
    kubectl(sim_stack, "taint", "node", node, "karpenter.sh/disrupted:NoSchedule")
    report = sim_stack.check_invariants(in_flight=[node])
    (violation,) = [v for v in report.violations if v.invariant == "maintenance-window"]
    assert violation.subject == f"node {node}"
    assert "MaintenanceWindow pause-default" in violation.message
