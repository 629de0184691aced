"""What each client costs the emulator (api_stats.py, `/metrics`, `karpflow sim api-stats`) and its
API Priority and Fairness answer (flowcontrol.py), with the official client as the caller."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from kubernetes import client

from sim.apiserver import EmulatorServer
from sim.apiserver.flowcontrol import TOO_MANY_REQUESTS, FlowControlConfig
from sim.cli import sim

from . import builders as b
from .helpers import http

pytestmark = pytest.mark.integration
WORKER = "system:serviceaccount:karpflow:karpflow-worker"


@pytest.fixture
def worker(emu: EmulatorServer) -> Iterator[client.CoreV1Api]:
    """The official client as the worker's ServiceAccount (a TokenRequest token: the emulator knows
    whom it names even when it does not check it)."""
    emu.api.stats.clear()
    emu.api.flow_control.config = None
    emu.store.create("namespaces", {"metadata": {"name": "karpflow"}})
    emu.store.create("serviceaccounts", {"metadata": {"name": "karpflow-worker"}}, "karpflow")
    configuration = emu.client_configuration(token=emu.service_account_token("karpflow", "karpflow-worker"))
    api = client.ApiClient(configuration)
    try:
        yield client.CoreV1Api(api)
    finally:
        api.close()
        emu.api.flow_control.config = None


def rows(emu: EmulatorServer) -> dict[tuple[str, str, str], dict[str, int]]:
    doc = json.loads(urllib.request.urlopen(f"{emu.url}/sim/api-stats").read())
    return {(r["user"], r["verb"], r["resource"]): r for r in doc["rows"]}


def test_requests_and_bytes_are_counted_by_user_verb_and_resource(emu, worker):
    for index in range(5):
        emu.store.create("nodes", b.node(f"n{index}"))
    worker.list_node()
    worker.list_node(limit=2)  # three pages: one full LIST
    listing = worker.list_node(limit=2)
    while listing.metadata._continue:
        listing = worker.list_node(limit=2, _continue=listing.metadata._continue)
    worker.list_node(label_selector="a=b")  # not a full LIST
    worker.read_node("n1")
    http(emu, "GET", "/api/v1/nodes")  # no token: anonymous
    counts = rows(emu)
    lists = counts[(WORKER, "list", "nodes")]
    assert lists["requests"] == 1 + 1 + 3 + 1
    assert lists["full_lists"] == 3  # the unpaginated one and each paginated one's first page
    assert lists["response_bytes"] > 5 * 100
    assert counts[(WORKER, "get", "nodes")]["requests"] == 1
    assert counts[("system:anonymous", "list", "nodes")]["full_lists"] == 1


def test_a_watch_counts_its_bytes_as_they_stream(emu, worker):
    emu.store.create("nodes", b.node("n0"))
    before = rows(emu).get((WORKER, "watch", "nodes"), {}).get("response_bytes", 0)
    stream = worker.list_node(watch=True, timeout_seconds=5, _preload_content=False)
    try:
        stream.readline()  # the ADDED of n0, while the watch is still open
        during = rows(emu)[(WORKER, "watch", "nodes")]["response_bytes"]
    finally:
        stream.release_conn()
    assert during - before > 100


def test_metrics_carry_kube_apiservers_series_and_the_users(emu, worker):
    emu.store.create("nodes", b.node("n0"))
    worker.list_node()
    worker.read_node("n0")
    text = urllib.request.urlopen(f"{emu.url}/metrics").read().decode()
    assert 'apiserver_request_total{code="200",resource="nodes",scope="",subresource="",verb="LIST"}' in text
    assert 'apiserver_response_sizes_count{resource="nodes",subresource="",verb="GET"} 1.0' in text
    assert f'emulator_full_lists_total{{resource="nodes",user="{WORKER}"}} 1.0' in text
    assert f'emulator_requests_total{{code="200",resource="nodes",user="{WORKER}",verb="get"}} 1.0' in text


def test_api_stats_command_prints_and_resets(emu, worker):
    worker.list_node()
    runner = CliRunner()
    result = runner.invoke(sim, ["--url", emu.url, "api-stats", "--json"], catch_exceptions=False)
    assert result.exit_code == 0
    assert any(r["user"] == WORKER and r["verb"] == "list" for r in json.loads(result.output)["rows"])
    result = runner.invoke(
        sim, ["--url", emu.url, "api-stats", "--user", WORKER, "--reset"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0 and "nodes" in result.output and "full LISTs" in result.output
    assert not any(user == WORKER for user, _, _ in rows(emu))


def test_flow_control_answers_429_with_retry_after_to_a_user_over_its_share(emu, worker):
    emu.store.create("nodes", b.node("n0"))
    admin = client.CoreV1Api(emu.api_client())
    # 2 seats a second for each user: the bucket holds 10, then one request in two is refused.
    emu.api.flow_control.config = FlowControlConfig(seats_per_second=4, user_share=0.5)
    configuration = worker.api_client.configuration
    configuration.retries = False  # to see the 429 itself: urllib3 would retry the GET
    refused = None
    with client.ApiClient(configuration) as api:
        for _ in range(20):
            try:
                client.CoreV1Api(api).read_node("n0")
            except client.ApiException as err:
                refused = err
                break
    assert refused is not None and refused.status == 429
    assert refused.headers["Retry-After"] == "1"
    assert refused.body == TOO_MANY_REQUESTS  # kube-apiserver's plain-text answer
    admin.read_node("n0")  # another user (anonymous here) has a share of its own
    counts = rows(emu)
    assert counts[(WORKER, "get", "nodes")]["rejected"] == 1
    assert counts[("system:anonymous", "get", "nodes")]["rejected"] == 0


def test_the_official_sync_client_waits_out_retry_after_on_a_get(emu, worker):
    """urllib3 (under the official sync client) retries a GET answered 429 after its Retry-After:
    every call succeeds, and the emulator counted the refusals."""
    emu.store.create("nodes", b.node("n0"))
    emu.api.flow_control.config = FlowControlConfig(seats_per_second=4, user_share=0.5)
    for _ in range(13):
        worker.read_node("n0")
    served = rows(emu)[(WORKER, "get", "nodes")]
    assert served["rejected"] >= 1
    assert served["requests"] == 13 + served["rejected"]


def test_flow_control_is_set_over_http_and_off_by_default(emu, worker):
    assert http(emu, "GET", "/sim/flowcontrol") == (200, {"config": None})
    status, body = http(emu, "PUT", "/sim/flowcontrol", {"seats_per_second": 100, "user_share": 0.25})
    assert status == 200 and body["config"] == {"seats_per_second": 100.0, "user_share": 0.25}
    assert http(emu, "PUT", "/sim/flowcontrol", {"seats_per_second": 0})[0] == 400
    assert http(emu, "DELETE", "/sim/flowcontrol") == (200, {"config": None})
