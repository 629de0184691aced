"""`karpflow demo` end to end (what `make demo` runs), on free ports and a temporary state dir.

The demo is run as a user runs it (with `--keep`), then the cluster it leaves is checked with
clients of the test's own: the `temporal` CLI for the workflows, the real kubectl for the nodes, boto3
against moto for the instances, the simulator's invariant endpoint. Which stack the demo picks (never
a running dev stack, busy ports replaced) is unit-tested in tests/unit/sim/test_demo_stack.py; here a
"dev stack" (a live process with its pid file) and a busy port check it end to end.
"""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

import boto3
import pytest

from api.constants import INITIALIZED_LABEL, INSTANCE_TYPE_LABEL, NODEPOOL_LABEL, REGISTERED_LABEL, ZONE_LABEL
from planner.snapshot import load_snapshot
from sim.binaries import temporal_cli
from sim.devstack import DevStack
from sim.testing import DEMO

from .test_devstack import free_ports

pytestmark = pytest.mark.integration


def karpflow(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200", **env},
        check=False,
    )


def list_workflows(address: str, query: str) -> list[dict[str, Any]]:
    """Workflows in the demo's Temporal, through the temporal CLI."""
    result = subprocess.run(
        [temporal_cli(), "workflow", "list", "--address", address, "-o", "json", "--query", query],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return json.loads(result.stdout or "[]")


def search_attribute(execution: dict[str, Any], name: str) -> Any:
    payload = execution["searchAttributes"]["indexedFields"][name]
    return json.loads(base64.b64decode(payload["data"]))


def kubectl_get(kubeconfig: Path, *args: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        ["kubectl", "--kubeconfig", str(kubeconfig), "get", *args, "-o", "json"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return json.loads(result.stdout)["items"]


def workflow_result(address: str, workflow_id: str) -> dict[str, Any]:
    """A closed workflow's result, through the temporal CLI (the DisruptionStatus as JSON)."""
    result = subprocess.run(
        [temporal_cli(), "workflow", "result", "--address", address, "-w", workflow_id, "-o", "json"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return json.loads(result.stdout)["result"]


def ec2_client(endpoint: str) -> Any:
    return boto3.client(
        "ec2", endpoint_url=endpoint, region_name="us-west-2",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    )  # fmt: skip


def instance_states(endpoint: str, cluster: str) -> dict[str, str]:
    """Node name (the instance's Name tag) -> EC2 state, for the cluster's own instances."""
    response = ec2_client(endpoint).describe_instances(
        Filters=[{"Name": f"tag:kubernetes.io/cluster/{cluster}", "Values": ["owned"]}]
    )
    states = {}
    for reservation in response["Reservations"]:
        for instance in reservation["Instances"]:
            tags = {t["Key"]: t["Value"] for t in instance.get("Tags") or []}
            states[tags.get("Name", instance["InstanceId"])] = instance["State"]["Name"]
    return states


@pytest.mark.slow(seconds=85)
def test_the_demo_disrupts_the_cluster_through_temporal_and_checks_it(tmp_path: Path):
    temporal, kube, moto = free_ports(3)
    # A "dev stack" that runs (one live process with its pid file) in the state dir the demo is
    # pointed at: the demo must leave it alone and run in <state dir>/demo.
    dev_dir = tmp_path / "state"
    dev_dir.mkdir()
    dev_process = subprocess.Popen(["sleep", "120"])
    time.sleep(0.05)  # the pid file must be younger than the process (see devstack._owned_process)
    (dev_dir / "temporal.pid").write_text(f"{dev_process.pid}\n")
    # A busy UI port given through the environment (not as a flag): the demo takes another one.
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    busy_port = busy.getsockname()[1]
    env = {"KARPFLOW_STATE_DIR": str(dev_dir), "KARPFLOW_UI_PORT": str(busy_port)}
    ports = ["--temporal-port", str(temporal), "--kube-port", str(kube), "--moto-port", str(moto)]
    demo_dir = dev_dir / "demo"
    started = time.monotonic()
    try:
        result = karpflow("demo", "--keep", *ports, env=env)
        elapsed = time.monotonic() - started
        out = result.stdout
        assert result.returncode == 0, out + result.stderr
        assert f"A dev stack runs in {dev_dir}" in out and str(demo_dir) in out
        assert dev_process.poll() is None and (dev_dir / "temporal.pid").is_file()
        ui = int(re.search(rf"Port {busy_port} \(Temporal Web UI\) is in use; the demo uses (\d+)", out)[1])
        stack = DevStack.from_state_dir(demo_dir)
        assert stack.running() and stack.settings.ui_port == ui
        address, kubeconfig = f"127.0.0.1:{temporal}", demo_dir / "kubeconfig"

        # What the demo showed: the cluster, the plan, the workflows it started and where to see them.
        for section in (
            "$ kubectl get nodes -o wide",
            "$ kubectl get pdb -A",
            "EC2 instances",
            "$ karpflow plan",
        ):
            assert section in out, section
        assert f"temporal workflow list --address {address}" in out
        assert "No invariant violations" in out and "Demo finished" in out

        # Temporal: every disruption the demo started completed, and the output names each one.
        executions = list_workflows(address, "WorkflowType = 'DisruptionWorkflow'")
        assert executions, out
        taken: dict[str, dict[str, Any]] = {}  # node -> the disruption that took it
        for execution in executions:
            workflow_id = execution["execution"]["workflowId"]
            assert execution["status"] == "WORKFLOW_EXECUTION_STATUS_COMPLETED", workflow_id
            assert workflow_id in out
            # A delete goes on with the candidates it could take (an empty node a pod just moved to
            # is not empty any more): the disrupted nodes are those its result says it tainted.
            for candidate in workflow_result(address, workflow_id)["candidates"]:
                if candidate["tainted"]:
                    taken[candidate["node"]] = execution
                else:
                    assert f"kept {candidate['node'].split('.')[0]}: " in out, candidate
        disrupted = set(taken)

        # The Web UI links filter with a visibility query: the first one lists the first pass's
        # disruptions and the terminations they started.
        url = re.search(rf"http://127\.0\.0\.1:{ui}/namespaces/default/workflows\?query=(\S+)", out)
        assert url, out
        listed = list_workflows(address, urllib.parse.unquote(url[1]))
        types = {w["type"]["name"] for w in listed}
        assert types == {"DisruptionWorkflow", "TerminationWorkflow"}, listed

        # The controller did on its own what the scenario was built to show: the expired node went,
        # the drifted one was replaced (below), and consolidation removed nodes.
        scenario = load_snapshot(DEMO)
        expired, drifted = (
            "ip-172-31-5-90.us-west-2.compute.internal",
            "ip-172-31-20-80.us-west-2.compute.internal",
        )
        assert {expired, drifted} <= disrupted
        # Consolidation removed nodes too: in us-west-2b while the window holds us-west-2a, and in
        # us-west-2a after it, where nodes that just received pods wait for consolidateAfter (1m)
        # beyond the demo's end: 6 to 8 of the 13 nodes go.
        reasons = [search_attribute(e, "KarpflowReason") for e in taken.values()]
        assert reasons.count("Underutilized") >= 2, reasons
        assert len(disrupted) >= 5, disrupted
        assert "The controller settled" in out

        # The operator's controls (issue 19): the demo applied a MaintenanceWindow and a
        # NodeDisruptionBudget with kubectl before the worker started, and said what they held back.
        for applied in (
            "maintenancewindow.karpflow.dev/demo-expire-later created",
            "nodedisruptionbudget.karpflow.dev/demo-one-of-us-west-2a created",
            "$ karpflow windows",
        ):
            assert applied in out, applied
        held = re.search(
            r"held back ip-172-31-5-90: expired at \S+, but MaintenanceWindow demo-expire-later blocks "
            r"Expiration until (\S+Z)",
            out,
        )
        assert held, out
        assert "MaintenanceWindow demo-expire-later closed" in out
        assert "let go ip-172-31-5-90: MaintenanceWindow demo-expire-later no longer holds it" in out
        # Soft expiration: the expired node went only once the window had closed.
        closes = datetime.fromisoformat(held[1].replace("Z", "+00:00"))
        went = datetime.fromisoformat(taken[expired]["startTime"].replace("Z", "+00:00"))
        assert went >= closes, (went, closes)
        assert re.search(r"held back ip-\S+: NodeDisruptionBudget demo-one-of-us-west-2a allows 0", out), out
        # kubectl describe node: the controller recorded why it waited, on the nodes themselves.
        events = kubectl_get(kubeconfig, "events", "-A")
        waited = {(e["reason"], e["involvedObject"]["name"]) for e in events}
        assert ("DisruptionWaitingWindow", expired) in waited, waited
        ndb_waits = {n for r, n in waited if r == "DisruptionWaitingNodeDisruptionBudget"}
        assert ndb_waits and all(scenario.nodes[n].labels[ZONE_LABEL] == "us-west-2a" for n in ndb_waits)

        # kubectl: the disrupted nodes are gone, every other scenario node is still there.
        nodes = {n["metadata"]["name"]: n for n in kubectl_get(kubeconfig, "nodes")}
        assert not disrupted & set(nodes)
        assert set(scenario.nodes) - disrupted <= set(nodes)

        # moto: their instances are terminated; every remaining scenario node's instance runs.
        endpoint = f"http://127.0.0.1:{moto}"
        states = instance_states(endpoint, stack.settings.cluster_name)
        assert {node: states.get(node) for node in disrupted} == dict.fromkeys(disrupted, "terminated")
        assert all(states.get(node) == "running" for node in set(scenario.nodes) & set(nodes)), states

        # The drifted node's pod fits on no other node of its zone: drift replaced it. Temporal's
        # record of that disruption names the replacement; kubectl and moto show it joined.
        (drift,) = list_workflows(
            address, "WorkflowType = 'DisruptionWorkflow' AND KarpflowReason = 'Drifted'"
        )
        assert search_attribute(drift, "KarpflowNodes") == [drifted]
        status = workflow_result(address, drift["execution"]["workflowId"])
        (replacement,) = status["replacements"]
        assert replacement["state"] == "Initialized", status
        new_node = replacement["node"]
        # Besides it, only consolidation's own replacements are new: a consolidation replaces rather
        # than deletes when the nodes its pods would join are inside their consolidateAfter window
        # (Karpenter v1.14), as us-west-2a's are right after the window's first moves.
        launched = set(nodes) - set(scenario.nodes)
        consolidation_new = {
            r["node"]
            for e in taken.values()
            if search_attribute(e, "KarpflowReason") == "Underutilized"
            for r in workflow_result(address, e["execution"]["workflowId"]).get("replacements") or ()
        }
        assert new_node in launched and launched - {new_node} <= consolidation_new, out
        node = nodes[new_node]
        labels = node["metadata"]["labels"]
        assert labels[INITIALIZED_LABEL] == labels[REGISTERED_LABEL] == "true", labels
        assert labels[NODEPOOL_LABEL] == "default" and labels[ZONE_LABEL] == "us-west-2b"
        assert {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"] == "True"
        assert not node["spec"].get("taints"), node["spec"]  # startup and unregistered taints gone
        instance_id = node["spec"]["providerID"].rsplit("/", 1)[-1]
        assert instance_id == replacement["instance_id"]
        (instance,) = ec2_client(endpoint).describe_instances(InstanceIds=[instance_id])["Reservations"][0][
            "Instances"
        ]
        assert instance["State"]["Name"] == "running"
        assert (
            instance["InstanceType"]
            == labels[INSTANCE_TYPE_LABEL]
            == replacement["offering"]["instance_type"]
        )
        tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
        assert tags[f"kubernetes.io/cluster/{stack.settings.cluster_name}"] == "owned"
        # The pods that moved: the drifted node's sessions pod (12Gi, pinned to us-west-2b, in the
        # scenario on the drifted node) runs on the replacement now, and so does every pod there
        # (later passes may pack more onto it).
        (was,) = [p for p in scenario.nodes[drifted].pods if p.labels.get("app") == "sessions"]
        on_new = kubectl_get(kubeconfig, "pods", "-A", "--field-selector", f"spec.nodeName={new_node}")
        sessions = [p for p in on_new if p["metadata"]["labels"].get("app") == "sessions"]
        assert len(sessions) == 1 and sessions[0]["metadata"]["name"] != was.name, on_new
        for pod in on_new:
            conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions") or ()}
            assert pod["status"]["phase"] == "Running" and conditions.get("Ready") == "True", pod
        # The demo's own summary names it too.
        assert f"New ({len(launched)}):\n" in out and f"\n  {new_node}: " in out, out

        # The invariant checker, with nothing in flight any more.
        with urllib.request.urlopen(f"http://127.0.0.1:{kube}/sim/invariants?in_flight=", timeout=30) as r:
            with_nothing_in_flight = json.loads(r.read())
        assert with_nothing_in_flight["ok"], with_nothing_in_flight["violations"]
        # ...and it judged every disruption against the window and the budget (never exceeded).
        observed = with_nothing_in_flight["observed"]
        assert observed["maintenance-windows"] == observed["node-disruption-budgets"] == 1, observed
        print(
            f"demo took {elapsed:.1f}s: {len(executions)} disruptions, {len(disrupted)} nodes, {new_node} new"
        )
    finally:
        karpflow("dev", "down", "--state-dir", str(demo_dir), env={}, timeout=60)
        dev_process.kill()
        dev_process.wait()
        busy.close()
