"""The README's workflow commands, run as written (bash, the real `temporal` CLI and kubectl) against
the demo scenario, a worker on the task queue `karpflow`, and the dev server."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from temporalio.client import WorkflowExecutionStatus

from api.constants import DISRUPTED_TAINT_KEY
from sim.binaries import temporal_cli
from sim.testing import DEMO, assert_no_violations
from tests.integration.workflows.conftest import REPO, wait_closed

pytestmark = pytest.mark.integration


def readme_blocks() -> list[str]:
    text = Path(REPO, "README.md").read_text()
    section = text.split("<!-- workflow-commands:begin -->")[1].split("<!-- workflow-commands:end -->")[0]
    return re.findall(r"```sh\n(.*?)```", section, re.S)


def test_the_readme_has_the_three_command_blocks():
    blocks = readme_blocks()
    assert len(blocks) == 3
    assert "DisruptionWorkflow" in blocks[0] and "TerminationWorkflow" in blocks[1] and "cancel" in blocks[2]


@pytest.mark.sim_stack(scenario=DEMO, time_scale=0.05)
async def test_the_readme_commands_work_as_written(karpflow):
    karpflow.task_queue = "karpflow"  # the README uses the default task queue
    cluster = karpflow.stack.cluster_name
    env = {
        "TEMPORAL_ADDRESS": karpflow.temporal_address,
        "KUBECONFIG": str(karpflow.stack.kubeconfig_path),
        "KARPFLOW_CLUSTER_NAME": cluster,  # as `source .state/env` sets it
        "PATH": os.path.dirname(temporal_cli()) + os.pathsep + os.environ["PATH"],
    }
    disrupt, terminate, cancel = readme_blocks()
    drifted = "ip-172-31-20-80.us-west-2.compute.internal"
    before = {i["InstanceId"] for i in karpflow.instances()}

    async with karpflow.worker(task_queue="karpflow"):
        shown = await karpflow.run("bash", "-euo", "pipefail", "-c", disrupt, **env)
        assert '"phase"' in shown.stdout and "Succeeded" in shown.stdout
        nodes = await karpflow.nodes()
        assert drifted not in nodes
        added = {i["InstanceId"] for i in karpflow.instances()} - before
        assert len(added) == 1

        deleted = "ip-172-31-6-110.us-west-2.compute.internal"
        deleted_uid = (await karpflow.nodes())[deleted]["metadata"]["uid"]
        shown = await karpflow.run("bash", "-euo", "pipefail", "-c", terminate, **env)
        # kubectl delete node started the termination every part of karpflow derives for it.
        assert f"termination/{cluster}/{deleted}/{deleted_uid}" in shown.stdout
        nodes = await karpflow.nodes()
        assert "ip-172-31-4-70.us-west-2.compute.internal" not in nodes
        assert "ip-172-31-6-110.us-west-2.compute.internal" not in nodes

        # Keep the replacement from initializing, so the cancel surely lands while it is awaited.
        karpflow.stack.faults.add_never_ready(instance_types=["m5.large"])
        await karpflow.run("bash", "-euo", "pipefail", "-c", cancel, **env)
        try:
            status = await wait_closed(
                karpflow.client, f"disruption/{cluster}/default/Underutilized/cancel-me"
            )
        except AssertionError:
            h = karpflow.client.get_workflow_handle(f"disruption/{cluster}/default/Underutilized/cancel-me")
            d = await h.describe()
            for a in d.raw_description.pending_activities:
                print("PENDING", a.activity_type.name, a.attempt, a.last_failure.message, a.heartbeat_details)
            print(await h.query("status"))
            raise
        assert status == WorkflowExecutionStatus.CANCELED
        # The example waited for a launched replacement, and the rollback terminated it.
        cancelled = [
            i
            for i in karpflow.instances(("pending", "running", "shutting-down", "terminated"))
            if any(
                t["Key"] == "karpflow.io/command-id" and "cancel-me" in t["Value"] for t in i.get("Tags", [])
            )
        ]
        assert len(cancelled) == 1, cancelled
        assert cancelled[0]["State"]["Name"] in ("shutting-down", "terminated")

    nodes = await karpflow.nodes()
    spot = nodes["ip-172-31-3-50.us-west-2.compute.internal"]
    assert not any(t["key"] == DISRUPTED_TAINT_KEY for t in spot["spec"].get("taints") or ())
    assert len({i["InstanceId"] for i in karpflow.instances()} - before) == 1  # only the first replacement
    assert_no_violations(karpflow.stack)
