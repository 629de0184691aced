"""Payload encryption end to end (SECURITY.md): a worker with a payload key file runs a termination
on a dev server whose Web UI is pointed at `karpflow codec-server` (`--ui-codec-endpoint`).

- the history, read raw with the `temporal` CLI, holds ciphertext: every payload is
  `binary/encrypted` under the key's id, and none carries the node's name or the input's fields;
- `temporal workflow show --codec-endpoint` reads it in plain text through the codec server;
- the UI's settings name the codec endpoint, the codec server answers the UI's origin with CORS and
  the plaintext, and (with Chromium) the rendered history page shows the decoded input.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import subprocess
import sys
import urllib.request
from typing import Any
from urllib.parse import quote

import pytest

from api.workflow_ids import termination_workflow_id
from api.workflow_io import TerminationInput
from runtime.connections import connect_temporal, ensure_search_attributes
from sim.binaries import temporal_cli
from sim.ports import free_port
from tests.integration.observe.test_web_ui import chromium, render
from tests.integration.workflows.conftest import REPO, node, scenario
from workflows.termination import TerminationWorkflow

pytestmark = [pytest.mark.integration, pytest.mark.slow]

A, B = node("172.31.1.10"), node("172.31.2.20")
ENCRYPTED = base64.b64encode(b"binary/encrypted").decode()

# The plain metadata Temporal's core writes in a local activity's marker (no payload of ours).
LOCAL_ACTIVITY_MARKER_KEYS = {
    "seq",
    "attempt",
    "activity_id",
    "activity_type",
    "complete_time",
    "backoff",
    "original_schedule_time",
    "activation_index",
}


def serving(address: str) -> bool:
    result = subprocess.run(
        [temporal_cli(), "operator", "cluster", "health", "--address", address],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    return "SERVING" in result.stdout


def http_json(url: str, body: Any = None, headers: dict[str, str] | None = None) -> tuple[dict, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json", **(headers or {})}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return dict(response.headers), json.load(response)


def payloads_in(
    value: Any, skip: tuple[str, ...] = ("searchAttributes", "markerRecordedEventAttributes")
) -> list[dict]:
    """Every Payload (a dict with base64 `data` and `metadata`) anywhere in a history's JSON, but
    under `skip`: search attributes (visibility indexes them) and markers (the SDK's core writes a
    `workflow.patched` marker with the patch id itself, outside the codec), never encrypted (SECURITY.md)."""
    found: list[dict] = []
    if isinstance(value, dict):
        if "metadata" in value and "data" in value and isinstance(value["metadata"], dict):
            found.append(value)
        for key, child in value.items():
            if key not in skip:
                found += payloads_in(child, skip)
    elif isinstance(value, list):
        for child in value:
            found += payloads_in(child, skip)
    return found


@pytest.mark.sim_stack(scenario=scenario([A, B], []))
async def test_history_is_ciphertext_at_rest_and_the_ui_path_decodes_it(karpflow, tmp_path):
    keys = tmp_path / "payload-keys"
    keys.write_text(
        f"old={base64.b64encode(os.urandom(32)).decode()}\nnew={base64.b64encode(os.urandom(32)).decode()}\n"
    )
    codec_port, port, ui_port = free_port("127.0.0.1"), free_port("127.0.0.1"), free_port("127.0.0.1")
    address, ui = f"127.0.0.1:{port}", f"http://127.0.0.1:{ui_port}"
    codec_url = f"http://127.0.0.1:{codec_port}"
    logs = (tmp_path / "codec.log").open("wb")
    codec = subprocess.Popen(  # noqa: ASYNC220 - started once, not waited on
        [sys.executable, "-m", "cli", "codec-server", "--port", str(codec_port), "--cors-origin", ui],
        cwd=REPO,
        env={**os.environ, "KARPFLOW_PAYLOAD_KEY_FILE": str(keys)},
        stdout=logs,
        stderr=logs,
    )
    server = subprocess.Popen(  # noqa: ASYNC220 - started once, not waited on
        [
            temporal_cli(),
            "server",
            "start-dev",
            "--ip",
            "127.0.0.1",
            "--port",
            str(port),
            "--ui-port",
            str(ui_port),
            "--db-filename",
            str(tmp_path / "temporal.db"),
            "--ui-codec-endpoint",
            codec_url,
            "--ui-disable-news-fetch",
            "--dynamic-config-value",
            "frontend.enableServerVersionCheck=false",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await karpflow.eventually(
            lambda: asyncio.to_thread(serving, address), within=60, what="the dev server"
        )
        settings = karpflow.settings(temporal_address=address, payload_key_file=keys)
        client = await connect_temporal(settings)
        assert await ensure_search_attributes(client)
        uid = (await karpflow.nodes())[A.name]["metadata"]["uid"]
        workflow_id = termination_workflow_id(karpflow.stack.cluster_name, A.name, uid)
        from worker import KarpflowWorker

        async with KarpflowWorker(settings, ec2=karpflow.stack.ec2_client()):
            handle = await client.start_workflow(
                TerminationWorkflow.run,
                TerminationInput(node=A.name, uid=uid, reason="Manual"),
                id=workflow_id,
                task_queue=karpflow.task_queue,
            )
            status = await asyncio.wait_for(handle.result(), 120)
        assert status.phase == "Succeeded"

        # 1. At rest: what the server stores, read without any codec.
        raw = await karpflow.run(
            temporal_cli(),
            "workflow",
            "show",
            "--address",
            address,
            "--workflow-id",
            workflow_id,
            "--output",
            "json",
        )
        history = json.loads(raw.stdout)
        payloads = payloads_in(history)
        assert len(payloads) >= 5  # input, activity arguments and results, the result
        for payload in payloads:
            assert payload["metadata"]["encoding"] == ENCRYPTED, payload
            assert base64.b64decode(payload["metadata"]["encryption-key-id"]) == b"new"
            clear = base64.b64decode(payload["data"])
            assert A.name.encode() not in clear and b"drain_attempt" not in clear
        assert "drain_attempt" not in raw.stdout
        # What stays plain in a marker is the SDK's own bookkeeping and nothing of the cluster: a
        # patch's id, or a local activity's sequence number, attempt, id, type and times (its result
        # is a payload like any other, encrypted).
        markers = [
            e["markerRecordedEventAttributes"]
            for e in history["events"]
            if "markerRecordedEventAttributes" in e
        ]
        local_activities = 0
        for marker in markers:
            for payload in payloads_in(marker, skip=()):
                if payload["metadata"]["encoding"] == ENCRYPTED:
                    continue
                clear = base64.b64decode(payload["data"])
                assert A.name.encode() not in clear and uid.encode() not in clear, payload
                keys = set(json.loads(clear))
                local_activities += "activity_type" in keys
                assert keys <= {"id", "deprecated"} | LOCAL_ACTIVITY_MARKER_KEYS, payload
        assert local_activities, "the lean termination runs its short steps as local activities"

        # 2. The CLI through the codec server reads it in plain text.
        decoded = await karpflow.run(
            temporal_cli(),
            "workflow",
            "show",
            "--address",
            address,
            "--workflow-id",
            workflow_id,
            "--codec-endpoint",
            codec_url,
            "--output",
            "json",
        )
        clear = [base64.b64decode(p["data"]) for p in payloads_in(json.loads(decoded.stdout))]
        assert clear and all(b"binary/encrypted" not in c for c in clear)
        assert any(b"drain_attempt" in c and A.name.encode() in c for c in clear)

        # 3. The UI's path: its settings name the codec, which answers the UI's origin.
        _, ui_settings = await asyncio.to_thread(http_json, f"{ui}/api/v1/settings")
        assert ui_settings["Codec"]["Endpoint"] == codec_url, ui_settings
        started = history["events"][0]["workflowExecutionStartedEventAttributes"]["input"]
        headers, answer = await asyncio.to_thread(
            http_json, f"{codec_url}/decode", started, {"Origin": ui, "X-Namespace": "default"}
        )
        assert headers["Access-Control-Allow-Origin"] == ui
        (plain,) = answer["payloads"]
        assert json.loads(base64.b64decode(plain["data"]))["node"] == A.name

        # 4. What an operator sees: the history page, rendered, shows the decoded input.
        with contextlib.suppress(pytest.skip.Exception):
            chromium()
            run = (await handle.describe()).run_id
            page = f"{ui}/namespaces/default/workflows/{quote(workflow_id, safe='')}/{run}/history"
            text = await asyncio.to_thread(render, page)
            assert "drain_attempt" in text, text[:3000]
    finally:
        for process in (server, codec):
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(20)
            if process.poll() is None:
                process.kill()
        logs.close()
