"""The `karpflow` executable without its traps, on two dev stacks at once (free ports, temporary state
directories; a developer's own stack is never touched):

- every subcommand finds a stack from the environment its `env` file exports, or from the one
  `karpflow --state-dir DIR` option;
- `dev up` after `dev up --no-worker` starts the worker (and `.state/env` names its metrics URL);
- `dev down` then `dev up` terminates the previous cluster's workflows before a worker can resume
  them against the new cluster (node names repeat across clusters);
- an empty snapshot is an error;
- `karpflow disrupt --yes NODE` starts the plan's command for the node, with a summary and a memo,
  and follows it to the end (tests/integration/observe/test_cli_verbs.py: what it asks, and what it
  holds out);
- `karpflow controller start` without a worker says so, and a worker started with the controller
  off still serves its passes; `karpflow status --node` says what holds a node back, as the node's
  Event and the unremovable metric do; the command it starts is counted and its Events listed.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowExecutionStatus

from cli import stack_environment
from planner import why_not
from sim.binaries import temporal_cli
from sim.devstack import RETIRED_REASON, DevStack
from sim.testing import SMALL

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EMPTY_NODE = "ip-172-31-2-30.us-west-2.compute.internal"  # small.yaml's empty node
BUSY_NODE = "ip-172-31-1-10.us-west-2.compute.internal"


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def clean_environment() -> dict[str, str]:
    """This process's environment without any dev stack's variables (a fresh shell)."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KARPFLOW_", "TEMPORAL_", "AWS_")) and k != "KUBECONFIG"
    }


def karpflow(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """The installed `karpflow` console script, as a script runs it (no terminal on stdin)."""
    executable = str(Path(sys.executable).parent / "karpflow")
    return subprocess.run(
        [executable, *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**clean_environment(), "COLUMNS": "250", **env},
        check=False,
    )


def sourced(state: Path) -> dict[str, str]:
    """What `source STATE/env` leaves in a shell."""
    return stack_environment(state)


def up(state: Path, *flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    temporal, kube, moto = free_ports(3)
    result = karpflow(
        "--state-dir",
        str(state),
        "dev",
        "up",
        "--temporal-port",
        str(temporal),
        "--kube-port",
        str(kube),
        "--moto-port",
        str(moto),
        "--scenario",
        str(SMALL),
        "--time-scale",
        "0.1",
        *flags,
        env={"KARPFLOW_UI": "false", "KARPFLOW_CONTROLLER": "false", **(env or {})},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def down(state: Path) -> None:
    karpflow("dev", "down", env={"KARPFLOW_STATE_DIR": str(state)})


async def temporal_client(state: Path) -> Client:
    return await Client.connect(sourced(state)["TEMPORAL_ADDRESS"])


def test_two_stacks_each_found_from_its_environment_or_state_dir(tmp_path: Path):
    a, b = tmp_path / "a", tmp_path / "b"
    try:
        up(a, "--no-worker", "--cluster-name", "cluster-a")
        up(b, "--no-worker", "--cluster-name", "cluster-b")
        for state, cluster in ((a, "cluster-a"), (b, "cluster-b")):
            env = sourced(state)
            # `source STATE/env`: dev status, sim status and plan --live all reach this stack
            status = karpflow("dev", "status", env=env)
            assert str(state) in status.stdout and cluster in status.stdout, status.stdout
            sim = karpflow("sim", "status", env=env)
            assert sim.returncode == 0 and cluster in sim.stdout, sim.stdout + sim.stderr
            planned = karpflow("plan", "--live", "-o", "json", env=env)
            assert planned.returncode == 0, planned.stderr
            assert json.loads(planned.stdout)["summary"]["nodes"] == 3
            # ... and so does the one --state-dir option, from a shell that sourced nothing
            again = karpflow("--state-dir", str(state), "sim", "status", env={})
            assert again.returncode == 0 and cluster in again.stdout
            # karpflow and temporal on PATH
            assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
        # `karpflow status` asks this stack's Temporal for this stack's controller (none runs here)
        status = karpflow("--state-dir", str(b), "status", env={})
        assert "cluster-b" in status.stderr and sourced(b)["TEMPORAL_ADDRESS"] not in sourced(a).values()
    finally:
        down(a)
        down(b)


def test_up_again_adds_the_worker_and_names_its_metrics_url(tmp_path: Path):
    state = tmp_path / "stack"
    try:
        first = up(state, "--no-worker")
        assert DevStack.from_state_dir(state).process("worker") is None
        assert "KARPFLOW_METRICS_URL" not in sourced(state), first.stdout
        second = karpflow("--state-dir", str(state), "dev", "up", env={"KARPFLOW_CONTROLLER": "false"})
        assert second.returncode == 0, second.stdout + second.stderr
        assert "nothing started" not in second.stdout
        assert DevStack.from_state_dir(state).process("worker") is not None
        url = sourced(state)["KARPFLOW_METRICS_URL"]
        status = karpflow("dev", "status", env=sourced(state))
        assert status.returncode == 0 and url in status.stdout, status.stdout
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        assert "karpenter_pods_eviction_requests_total" in text and "temporal_" in text
    finally:
        down(state)


def test_down_and_up_never_resume_the_previous_clusters_workflows(tmp_path: Path):
    state = tmp_path / "stack"
    try:
        up(state, "--no-worker")
        env = sourced(state)
        # A termination started while no worker runs: it waits in Temporal's database.
        started = subprocess.run(
            [
                temporal_cli(),
                "workflow",
                "start",
                "--address",
                env["TEMPORAL_ADDRESS"],
                "--type",
                "TerminationWorkflow",
                "--task-queue",
                "karpflow",
                "--workflow-id",
                f"termination/{BUSY_NODE}",
                "--input",
                json.dumps({"node": BUSY_NODE, "reason": "Manual"}),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert started.returncode == 0, started.stderr
        down(state)
        assert (state / "temporal.db").is_file()  # the history is kept
        # The same ports again (free ones: the defaults may be taken by another stack on this machine).
        ports = {
            "--temporal-port": env["TEMPORAL_ADDRESS"].rpartition(":")[2],
            "--kube-port": env["KARPFLOW_SIM_URL"].rpartition(":")[2],
            "--moto-port": env["AWS_ENDPOINT_URL"].rpartition(":")[2],
        }
        again = karpflow(
            "--state-dir",
            str(state),
            "dev",
            "up",
            *(item for pair in ports.items() for item in pair),
            "--time-scale",
            "0.1",
            env={"KARPFLOW_CONTROLLER": "false"},
        )
        assert again.returncode == 0, again.stdout + again.stderr
        assert "terminated 1 workflow(s) of the previous cluster" in " ".join(again.stdout.split())

        async def check() -> None:
            client = await temporal_client(state)
            handle = client.get_workflow_handle(f"termination/{BUSY_NODE}")
            described = await handle.describe()
            assert described.status == WorkflowExecutionStatus.TERMINATED
            history = await handle.fetch_history()
            kinds = [e.WhichOneof("attributes") for e in history.events]
            assert "activity_task_scheduled_event_attributes" not in kinds  # no step ever ran
            terminated = history.events[-1].workflow_execution_terminated_event_attributes
            assert terminated.reason == RETIRED_REASON

        asyncio.run(check())
        # The new cluster's node of the same name is untouched.
        nodes = subprocess.run(
            ["kubectl", "get", "node", BUSY_NODE, "-o", "json"],
            capture_output=True,
            text=True,
            timeout=30,
            env={**clean_environment(), **sourced(state)},
            check=True,
        )
        assert not json.loads(nodes.stdout)["metadata"].get("deletionTimestamp")
    finally:
        down(state)


def test_an_empty_snapshot_is_an_error(tmp_path: Path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("apiVersion: v1\nkind: List\nitems: []\n")
    result = karpflow("plan", "--snapshot", str(empty), env={})
    assert result.returncode == 2
    assert "no Node in" in result.stderr and "nothing to do" not in result.stdout


def test_disrupt_starts_the_plans_command_for_a_node_and_follows_it(tmp_path: Path):
    state = tmp_path / "stack"
    try:
        up(state)  # with its worker; the controller is off, so only `disrupt` acts
        refused = karpflow(
            "--state-dir",
            str(state),
            "disrupt",
            "--yes",
            "ip-172-31-17-20.us-west-2.compute.internal",
            env={},
        )
        assert refused.returncode == 1
        assert "do-not-disrupt" in refused.stdout and "Nothing to start" in refused.stdout

        result = karpflow("--state-dir", str(state), "disrupt", "--yes", EMPTY_NODE, env={}, timeout=240)
        assert result.returncode == 0, result.stdout + result.stderr
        out = " ".join(result.stdout.split())
        assert "started disruption/karpflow-dev/default/Empty/" in out  # the dev stack's cluster
        assert "Empty: delete 1 node: ip-172-31-2-30" in out
        assert ": Succeeded" in out  # followed to the end

        async def check() -> None:
            client = await temporal_client(state)
            async for execution in client.list_workflows('WorkflowType="DisruptionWorkflow"'):
                described = await client.get_workflow_handle(execution.id).describe()
                assert described.status == WorkflowExecutionStatus.COMPLETED
                assert (await described.static_summary()).startswith("Empty: delete 1 node")
                memo = await described.memo()
                assert memo["command"] == f"karpflow --state-dir {state} disrupt --yes {EMPTY_NODE}"
                assert memo["estimatedSavingsPerHour"] > 0
                return
            raise AssertionError("no DisruptionWorkflow listed")

        asyncio.run(check())
        nodes = subprocess.run(
            ["kubectl", "get", "nodes", "-o", "name"],
            capture_output=True,
            text=True,
            timeout=30,
            env={**clean_environment(), **sourced(state)},
            check=True,
        ).stdout
        assert EMPTY_NODE not in nodes
    finally:
        down(state)


def test_a_controller_started_by_hand_is_served_by_a_worker_started_without_one(tmp_path: Path):
    """The KARPFLOW_CONTROLLER=false trap: `karpflow controller start` with no worker says so; a worker
    started with the controller off still runs its passes (every worker registers plan_pass), and
    `karpflow status --node` then names what holds a node back, as its Event and metric do."""
    state = tmp_path / "stack"
    try:
        up(state, "--no-worker")
        started = karpflow("controller", "start", env=sourced(state))
        assert started.returncode == 0, started.stdout + started.stderr
        assert "no worker polls task queue karpflow" in " ".join(started.stderr.split()), started.stderr
        again = karpflow("--state-dir", str(state), "dev", "up", env={"KARPFLOW_CONTROLLER": "false"})
        assert again.returncode == 0, again.stdout + again.stderr
        env = sourced(state)

        status: dict = {}
        for _ in range(90):
            shown = karpflow("status", "-o", "json", env=env)
            status = json.loads(shown.stdout) if shown.returncode == 0 else {}
            if status.get("last_pass_at") and status.get("blocked"):
                break
            time.sleep(1)
        assert status.get("blocked"), status

        kinds = {node: why_not.kind_of(reason) for node, reason in status["blocked"].items()}
        node, kind = next((n, k) for n, k in sorted(kinds.items()) if why_not.EVENTS[k] is not None)
        shown = karpflow("status", "--node", node, "-o", "json", env=env)
        assert shown.returncode == 0, shown.stderr
        answer = json.loads(shown.stdout)
        assert answer["held_back"] and answer["kind"] == str(kind)
        assert answer["reason"] == status["blocked"][node]
        text = karpflow("status", "--node", node, env=env).stdout
        assert f"held back: {kind}" in text and answer["event"] in text

        recorded = ""
        for _ in range(30):
            recorded = subprocess.run(
                ["kubectl", "get", "events", "-A", "--field-selector", f"involvedObject.name={node}"],
                capture_output=True,
                text=True,
                timeout=30,
                env={**clean_environment(), **env},
                check=False,
            ).stdout
            if answer["event"] in recorded:
                break
            time.sleep(1)
        assert answer["event"] in recorded, recorded
        with urllib.request.urlopen(env["KARPFLOW_METRICS_URL"], timeout=10) as response:
            exposed = response.read().decode()
        assert f'karpflow_unremovable_nodes{{reason="{kind}"}}' in exposed
        assert "karpflow_controller_pass_duration_seconds_count" in exposed

        # The empty node's command, started by the controller: a decision counted, its Events listed.
        decided = ""
        for _ in range(60):
            with urllib.request.urlopen(env["KARPFLOW_METRICS_URL"], timeout=10) as response:
                decided = response.read().decode()
            if "karpenter_voluntary_disruption_decisions_total{" in decided:
                break
            time.sleep(1)
        counted = [
            line
            for line in decided.splitlines()
            if line.startswith("karpenter_voluntary_disruption_decisions_total{")
            and 'decision="delete"' in line
            and 'reason="Empty"' in line
            and 'consolidation_type="empty"' in line
        ]
        assert counted and float(counted[0].rsplit(" ", 1)[1]) >= 1, decided[-3000:]
        terminating = ""
        for _ in range(60):
            terminating = subprocess.run(
                ["kubectl", "get", "events", "-A", "--field-selector", f"involvedObject.name={EMPTY_NODE}"],
                capture_output=True,
                text=True,
                timeout=30,
                env={**clean_environment(), **env},
                check=False,
            ).stdout
            if "DisruptionTerminating" in terminating:
                break
            time.sleep(1)
        assert "DisruptionTerminating" in terminating, terminating
    finally:
        down(state)
