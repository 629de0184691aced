"""The Temporal Web UI after a real disruption, read from what headless Chromium renders.

A dev server with its UI, the simulated cluster, karpflow's worker; the disruption the live plan has
for the empty node is started the way `karpflow disrupt` starts it (summary, details, memo) and
runs to the end. Then Chromium (Debian's package, installed by `make test`; nothing is downloaded)
loads the pages an operator would: the workflow list filtered by the node's name lists it and a
filter on another node does not, the workflow's history shows its one-line summary, its Memo tab
the command that started it. Screenshots go to tests/artifacts/web-ui/
(git-ignored); the best is docs/images/web-ui-disruption.png.
"""

from __future__ import annotations

import asyncio
import html
import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest
from temporalio.testing import WorkflowEnvironment

from cluster.informer import list_cluster
from kube.client import KubeApi
from planner.catalog import bundled_catalog
from planner.model import PlanOptions
from planner.plan import plan
from planner.snapshot import Snapshot
from runtime.connections import ensure_search_attributes, with_karpflow_converter
from runtime.disrupt_cli import start
from sim.binaries import temporal_cli
from sim.ports import free_port
from sim.testing import SMALL
from tests.integration.workflows.conftest import REPO, Karpflow

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ARTIFACTS = Path(REPO, "tests", "artifacts", "web-ui")
EMPTY_NODE = "ip-172-31-2-30.us-west-2.compute.internal"
OTHER_NODE = "ip-172-31-1-10.us-west-2.compute.internal"
# As root Chromium needs --no-sandbox; the rest keep it from calling out (the machine is offline).
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--window-size=1600,900",
    "--virtual-time-budget=10000",
]


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed: `make test` installs it (apt-get install chromium)")
    pytest.skip("chromium is not installed (`apt-get install chromium`, or run `make test`)")


def render(url: str, screenshot: Path | None = None) -> str:
    """The page's text after its scripts ran (the DOM Chromium dumps, tags and scripts removed)."""
    browser = chromium()
    dom = subprocess.run(
        [browser, *CHROMIUM_FLAGS, "--dump-dom", url], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    if screenshot is not None:
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [browser, *CHROMIUM_FLAGS, f"--screenshot={screenshot}", url],
            capture_output=True,
            timeout=120,
            check=True,
        )
    text = re.sub(r"<(script|style)[^>]*>.*?</\1>", " ", dom, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", text)))


def node_filter(node: str) -> str:
    """The list's query for workflows naming `node`, as the UI's filter bar writes it."""
    return quote('KarpflowNodes="' + node + '"')


def empty_node_command(objects: list[dict]) -> object:
    result = plan(Snapshot.from_objects(objects), bundled_catalog("us-west-2"), PlanOptions(all_methods=True))
    (command,) = [c for c in result.commands_ if EMPTY_NODE in c.nodes]
    return command


@pytest.mark.slow(seconds=75)
async def test_the_web_ui_lists_filters_and_summarizes_a_disruption(make_sim_stack, tmp_path):
    chromium()
    ui = free_port("127.0.0.1")
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli(),
        ui=True,
        ui_port=ui,
        dev_server_extra_args=[
            "--ui-disable-news-fetch",
            "--dynamic-config-value",
            "frontend.enableServerVersionCheck=false",
        ],
    )
    try:
        client = with_karpflow_converter(env.client)
        assert await ensure_search_attributes(client)
        stack = await asyncio.to_thread(make_sim_stack, scenario=SMALL, time_scale=0.05)
        kube = KubeApi.for_host(stack.kube_url, user_agent="karpflow-tests")
        world = Karpflow(
            stack,
            client,
            kube,
            f"ui-{uuid.uuid4().hex[:8]}",
            client.service_client.config.target_host,
            tmp_path,
        )
        try:
            command = empty_node_command(await list_cluster(kube))
            async with world.worker():
                started_by = f"karpflow disrupt --yes {EMPTY_NODE}"
                item = await start(client, world.settings(), command, started_by)
                status = await item.handle.result()
                assert status["phase"] == "Succeeded", status
        finally:
            await kube.close()

        base = f"http://127.0.0.1:{ui}/namespaces/default/workflows"
        by_node = await asyncio.to_thread(
            render,
            f"{base}?query={node_filter(EMPTY_NODE)}",
            ARTIFACTS / "list-filtered-by-node.png",
        )
        assert item.workflow_id in by_node, by_node[:2000]
        # ... with the node's termination, which the disruption started, and nothing else
        termination = status["candidates"][0]["termination_id"]
        assert termination.startswith(f"termination/{world.stack.cluster_name}/{EMPTY_NODE}/"), termination
        assert termination in by_node and "2 Workflows" in by_node, by_node[:2000]
        by_other = await asyncio.to_thread(render, f"{base}?query={node_filter(OTHER_NODE)}")
        assert item.workflow_id not in by_other and "No Workflows" in by_other, by_other[:2000]

        run = (await item.handle.describe()).run_id
        page = f"{base}/{quote(item.workflow_id, safe='')}/{run}"
        history = await asyncio.to_thread(render, f"{page}/history", ARTIFACTS / "workflow-history.png")
        assert "Completed" in history or "COMPLETED" in history, history[:2000]
        assert "Empty: delete 1 node: ip-172-31-2-30, saves $" in history, history[:3000]
        # The User Metadata tab (summary and details) is left out: its content is in a frame the
        # dumped DOM does not hold, and headless Chromium has not finished a screenshot of it in any
        # run since the evening of 2026-11-26 (45 s lost each time). docs/images/web-ui-disruption.png
        # was taken of it before.
        memo = await asyncio.to_thread(render, f"{page}/memo", ARTIFACTS / "workflow-memo.png")
        assert started_by in memo and "estimatedSavingsPerHour" in memo, memo[:3000]
        # The summaries the workflows set on their own steps: the disruption's taint, and the
        # steps of the termination it started.
        assert "taint ip-172-31-2-30" in history, history[:3000]
        handle = client.get_workflow_handle(termination)
        steps = await asyncio.to_thread(
            render,
            f"{base}/{quote(termination, safe='')}/{(await handle.describe()).run_id}/history",
            ARTIFACTS / "termination-history.png",
        )
        # The deadline is stamped by the gate, when the drain may begin (issue 30), not at delete.
        for step in ("delete ip-172-31-2-30 (Empty)", "may ip-172-31-2-30 go?", "drain ip-172-31-2-30"):
            assert step in steps, (step, steps[:3000])
    finally:
        await env.shutdown()
