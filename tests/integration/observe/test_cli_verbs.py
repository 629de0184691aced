"""The operator's verbs do what they say (issue 31), with the installed `karpflow` console script
against a dev stack of its own (free ports, a temporary state directory):

- `karpflow disrupt` shows what would start and asks: without a terminal and without `--yes` it
  starts nothing (exit 2), `--dry-run` only shows; it never gives a node that a running command holds
  a second command, and names that command (and the `karpflow approve` that ends its wait); while
  its own command waits for approval it says so, with the command that ends the wait;
- every verb checks that its target exists and exits non-zero naming what is wrong: `rollout` of a
  NodePool that does not exist, `rollout --status` of a rollout that failed, `pause --nodepool` of a
  NodePool that does not exist (unless `--allow-missing`), `disrupt` and `status --node` of a Node
  that does not exist, `approve` of the controller's id; `resume` says what it resumed; `status -o
  json` without a controller is JSON;
- `karpflow status` of a stopped controller says so first, and lists neither "working" nor what
  finished since its last pass.
"""

from __future__ import annotations

import asyncio
import json
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowExecutionStatus

from sim.binaries import temporal_cli
from tests.integration.observe.test_cli_traps import (
    EMPTY_NODE,
    clean_environment,
    down,
    karpflow,
    sourced,
    temporal_client,
    up,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CLUSTER = "karpflow-dev"  # the dev stack's
BY_HAND = f"disruption/{CLUSTER}/default/Empty/by-hand"


def kubectl(env: dict[str, str], *args: str) -> str:
    return subprocess.run(
        ["kubectl", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**clean_environment(), **env},
        check=True,
    ).stdout


def temporal(env: dict[str, str], *args: str) -> None:
    subprocess.run(
        [temporal_cli(), *args, "--address", env["TEMPORAL_ADDRESS"]],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )


def text(result: subprocess.CompletedProcess[str]) -> str:
    """stdout and stderr as one line (rich wraps long lines)."""
    return " ".join((result.stdout + result.stderr).split())


async def disruptions(client: Client) -> dict[str, WorkflowExecutionStatus | None]:
    return {e.id: e.status async for e in client.list_workflows("WorkflowType = 'DisruptionWorkflow'")}


def wait_for(check, what: str, seconds: float = 120):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def phase_listed(state: Path, workflow_id: str, phase: str) -> bool:
    async def look() -> bool:
        client = await temporal_client(state)
        query = f"WorkflowId = '{workflow_id}' AND KarpflowPhase = '{phase}'"
        return [e async for e in client.list_workflows(query)] != []

    return asyncio.run(look())


def closed(state: Path, workflow_id: str) -> bool:
    async def look() -> bool:
        described = await (await temporal_client(state)).get_workflow_handle(workflow_id).describe()
        return described.status != WorkflowExecutionStatus.RUNNING

    return asyncio.run(look())


class Running:
    """`karpflow ...` running in the background, its output read line by line as it comes."""

    def __init__(self, *args: str, env: dict[str, str]) -> None:
        executable = str(Path(sys.executable).parent / "karpflow")
        self.process = subprocess.Popen(
            [executable, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**clean_environment(), "COLUMNS": "250", **env},
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)

    def wait_for_line(self, pattern: str, seconds: float = 120) -> re.Match[str]:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                self.seen.append(self.lines.get(timeout=1))
            except queue.Empty:
                continue
            if found := re.search(pattern, self.seen[-1]):
                return found
        raise AssertionError(f"no line matching {pattern!r} in {''.join(self.seen)}")

    def finish(self, seconds: float = 240) -> tuple[int, str]:
        code = self.process.wait(timeout=seconds)
        time.sleep(0.2)  # the reader thread takes the last lines
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return code, " ".join("".join(self.seen).split())


def test_disrupt_asks_first_and_holds_out_a_node_another_command_holds(tmp_path: Path):
    state = tmp_path / "stack"
    try:
        up(state)  # with its worker; the controller is off, so only `disrupt` acts
        env = sourced(state)

        # No terminal to ask on and no --yes: nothing starts, and it says how to go on.
        asked = karpflow("disrupt", EMPTY_NODE, env=env)
        assert asked.returncode == 2, text(asked)
        assert "--yes" in text(asked) and "--dry-run" in text(asked) and "nothing started" in text(asked)
        shown = karpflow("disrupt", "--dry-run", EMPTY_NODE, env=env)
        assert shown.returncode == 0, text(shown)
        assert f"disruption/{CLUSTER}/default/Empty/" in text(shown) and "nothing started" in text(shown)
        assert EMPTY_NODE in text(shown) and "NodePool default" in text(shown)
        assert asyncio.run(disruptions(asyncio.run(temporal_client(state)))) == {}

        # A command started by hand holds the node while it waits for approval (its node is not
        # tainted yet): `disrupt` gives the node no second command, and names the first.
        kubectl(env, "annotate", "nodepool", "default", "karpflow.dev/require-approval=true")
        temporal(
            env,
            "workflow",
            "start",
            "--type",
            "DisruptionWorkflow",
            "--task-queue",
            "karpflow",
            "--workflow-id",
            BY_HAND,
            "--input",
            json.dumps({"reason": "Empty", "nodes": [EMPTY_NODE], "approval": {}}),
        )
        wait_for(lambda: phase_listed(state, BY_HAND, "AwaitingApproval"), "the by-hand command to wait")
        held = karpflow("disrupt", "--yes", EMPTY_NODE, env=env)
        assert held.returncode == 1, text(held)
        assert f"Disruption {BY_HAND} waits for approval" in text(held)
        assert f"`karpflow approve {BY_HAND}`" in text(held) and "Nothing to start" in text(held)

        async def only_by_hand() -> None:
            assert list(await disruptions(await temporal_client(state))) == [BY_HAND]

        asyncio.run(only_by_hand())
        rejected = karpflow("reject", BY_HAND, "--reason", "the test starts its own", env=env)
        assert rejected.returncode == 0 and "rejected" in rejected.stdout, text(rejected)
        wait_for(lambda: closed(state, BY_HAND), "the rejected command to close")

        # Its own command waits for approval too: it says what ends the wait, and goes on after it.
        follow = Running("disrupt", "--yes", EMPTY_NODE, env=env)
        started = follow.wait_for_line(r"started (disruption/\S+):")
        workflow_id = started.group(1)
        follow.wait_for_line(re.escape(f"`karpflow approve {workflow_id}`"))
        approved = karpflow("approve", workflow_id, env=env)
        assert approved.returncode == 0 and f"{workflow_id}: approved" in approved.stdout, text(approved)
        code, output = follow.finish()
        assert code == 0, output
        assert f"{workflow_id}: Succeeded" in output
        assert EMPTY_NODE not in kubectl(env, "get", "nodes", "-o", "name")
    finally:
        down(state)


@pytest.mark.slow(seconds=95)
def test_every_verb_checks_its_target_and_says_what_it_did(tmp_path: Path):
    state = tmp_path / "stack"
    try:
        up(state)  # with its worker, the controller not started yet
        env = sourced(state)

        # No controller: -o json is still JSON, and says so.
        missing = karpflow("status", "-o", "json", env=env)
        assert missing.returncode == 1
        assert json.loads(missing.stdout)["controller"]["state"] == "missing", text(missing)

        # A NodePool or Node that does not exist is named, and nothing starts.
        rollout = karpflow("rollout", "no-such-pool", env=env)
        assert rollout.returncode == 2, text(rollout)
        assert "no NodePool no-such-pool in the cluster" in text(rollout) and "rollout/" not in rollout.stdout
        node = karpflow("status", "--node", "no-such-node", env=env)
        assert node.returncode == 2 and "no Node no-such-node in the cluster" in text(node), text(node)
        disrupt = karpflow("disrupt", "--yes", "no-such-node", env=env)
        assert disrupt.returncode == 2 and "no Node no-such-node in the cluster" in text(disrupt), text(
            disrupt
        )

        # A rollout that failed (started by hand, past the CLI's check) says it failed, and why.
        failed = f"rollout/{CLUSTER}/no-such-pool/by-hand"
        temporal(
            env,
            "workflow",
            "start",
            "--type",
            "RolloutWorkflow",
            "--task-queue",
            "karpflow",
            "--workflow-id",
            failed,
            "--input",
            json.dumps(
                {"cluster": CLUSTER, "nodepool": "no-such-pool", "requested_at": "2026-12-01T00:00:00Z"}
            ),
        )
        wait_for(lambda: closed(state, failed), "the rollout to fail")
        status = karpflow("rollout", "--status", failed, env=env)
        assert status.returncode == 1, text(status)
        assert f"{failed}: Failed" in text(status) and "no such NodePool" in text(status)
        assert "Marking" not in text(status)

        started = karpflow("controller", "start", env=env)
        assert started.returncode == 0, text(started)

        # A pause of a NodePool that does not exist is refused unless asked for; resume says what.
        pause = karpflow("pause", "--nodepool", "no-such-pool", env=env)
        assert pause.returncode == 2 and "--allow-missing" in text(pause), text(pause)
        assert "no NodePool no-such-pool in the cluster" in text(pause)
        ahead = karpflow("pause", "--nodepool", "no-such-pool", "--allow-missing", env=env)
        assert ahead.returncode == 0 and "paused: NodePool no-such-pool" in text(ahead), text(ahead)
        resumed = karpflow("resume", "--nodepool", "no-such-pool", env=env)
        assert resumed.returncode == 0, text(resumed)
        assert "resumed: NodePool no-such-pool" in text(resumed) and "nothing paused now" in text(resumed)

        # approve takes a disruption's id: the controller's is refused in words, not an SDK error.
        controller = f"karpflow-controller/{CLUSTER}"
        approve = karpflow("approve", controller, env=env)
        assert approve.returncode == 2, text(approve)
        assert f"{controller} is a ControllerWorkflow, not a disruption" in text(approve)
        assert "RuntimeError" not in text(approve)
    finally:
        down(state)


def test_status_of_a_stopped_controller_says_so_first_and_only_what_is_current(tmp_path: Path):
    state = tmp_path / "stack"
    try:
        up(state)
        env = sourced(state)
        # The controller's command for the empty node waits for approval: in flight at every pass.
        kubectl(env, "annotate", "nodepool", "default", "karpflow.dev/require-approval=true")
        assert karpflow("controller", "start", env=env).returncode == 0

        def waiting() -> str | None:
            shown = karpflow("status", "-o", "json", env=env)
            status = json.loads(shown.stdout) if shown.returncode == 0 else {}
            held = status.get("blocked", {}).get(EMPTY_NODE, "")
            return (
                status["in_flight"][0] if status.get("in_flight") and "waits for approval" in held else None
            )

        workflow_id = wait_for(waiting, "a pass that sees the command wait for approval")
        stopped = karpflow("controller", "stop", "--reason", "maintenance", env=env)
        assert stopped.returncode == 0, text(stopped)
        assert karpflow("approve", workflow_id, env=env).returncode == 0
        wait_for(lambda: closed(state, workflow_id), "the approved command to finish")

        shown = karpflow("status", env=env)
        assert shown.returncode == 0, text(shown)
        first = shown.stdout.splitlines()[0]
        assert "stopped by" in first and "maintenance" in first, shown.stdout
        assert "working" not in text(shown) and "quiet" not in text(shown)
        assert workflow_id not in text(shown)  # finished since the last pass: neither in flight nor held
        as_json = json.loads(karpflow("status", "-o", "json", env=env).stdout)
        assert as_json["controller"]["state"] == "stopped" and as_json["in_flight"] == []
        assert EMPTY_NODE not in as_json["blocked"] and not as_json["quiet"]
    finally:
        down(state)
