"""Workflow inputs a person types, worker settings, error classification, log lines."""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ParamValidationError
from click.testing import CliRunner
from pydantic import ValidationError

from activities import errors
from activities.errors import classify_ec2, classify_kube
from api.constants import REASON_DRIFTED
from api.workflow_io import (
    DisruptionInput,
    InvalidInput,
    ReplacementSpec,
    disruption_input,
    disruption_workflow_id,
    parse_input,
)
from kube.client import KubeError
from planner.catalog import bundled_catalog
from planner.model import Command, Replacement
from runtime.settings import WorkerSettings
from runtime.telemetry import JsonFormatter, TemporalContextFilter, configure_logging
from worker import cli


def test_a_hand_typed_disruption_validates_with_go_durations_and_defaults():
    command = parse_input(
        DisruptionInput,
        {
            "reason": "Drifted",
            "nodes": ["a", "b"],
            "replacements": [
                {"nodepool": "default", "instance_types": ["m5.large"], "capacity_type": "spot"}
            ],
            "timeouts": {"replacement_ready": "15m", "heartbeat": 20},
        },
    )
    assert command.timeouts.replacement_ready == timedelta(minutes=15)
    assert command.timeouts.heartbeat == timedelta(seconds=20)
    assert command.replacements[0].capacity_type == ["spot"]
    assert json.loads(command.model_dump_json())["timeouts"]["replacement_ready"] == "15m"


def test_offerings_are_tried_capacity_type_then_price_then_zone():
    spec = ReplacementSpec(
        nodepool="p", instance_types=["m5.large", "m5.xlarge"], capacity_type=["spot", "on-demand"]
    )
    order = [o.key for o in spec.offering_order(["z1", "z2"])]
    assert order[:4] == ["m5.large/z1/spot", "m5.large/z2/spot", "m5.xlarge/z1/spot", "m5.xlarge/z2/spot"]
    assert order[4] == "m5.large/z1/on-demand" and len(order) == 8
    assert [
        o.zone
        for o in ReplacementSpec(nodepool="p", instance_types=["m5.large"], zones=["z9"]).offering_order(
            ["z1"]
        )
    ] == ["z9"]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"reason": "Drifted", "nodes": ["a", "a"]},
            "nodes: Value error, candidate node names must be distinct",
        ),
        (
            {"reason": "Drifted", "nodes": ["a"], "replacements": [{"nodepool": "p"}]},
            "replacements.0: Value error",
        ),
        ({"reason": "Drifted", "nodes": ["a"], "timeouts": {"heartbeat": "1 minute"}}, "timeouts.heartbeat"),
        (
            {"reason": "Drifted", "nodes": ["a"], "replacement": []},
            "replacement: Extra inputs are not permitted",
        ),
        ("Drifted", "expected a JSON object, got str"),
    ],
)
def test_bad_inputs_name_the_field(raw, message):
    with pytest.raises(InvalidInput) as bad:
        parse_input(DisruptionInput, raw)
    assert message in str(bad.value) and str(bad.value).startswith("invalid DisruptionInput")


def test_a_planner_command_becomes_a_workflow_input():
    catalog = bundled_catalog()
    node = type("N", (), {"uid": "8f1c2d3e-0000-4000-8000-000000000001"})()
    candidate = type("C", (), {"name": "ip-1", "pool_name": "default", "price": 0.2, "node": node})()
    command = Command(
        method="drift",
        reason=REASON_DRIFTED,
        candidates=[candidate],
        replacements=[
            Replacement(
                "default", [catalog.get("m5.large"), catalog.get("m5.xlarge")], "spot", ["us-west-2a"]
            )
        ],
    )
    made = disruption_input(command)
    assert made.nodes == ["ip-1"] and made.reason == "Drifted"
    assert made.node_uids == {"ip-1": node.uid}  # pinned to the node the planner saw
    assert made.replacements[0].instance_types == ["m5.large", "m5.xlarge"]
    assert made.replacements[0].capacity_type == ["spot"]
    assert disruption_workflow_id(command, "prod") == f"disruption/prod/default/Drifted/{command.id}"


def test_settings_come_from_the_environment_and_flags_win(monkeypatch):
    monkeypatch.setenv("KARPFLOW_CLUSTER_NAME", "prod")
    monkeypatch.setenv("KARPFLOW_TASK_QUEUE", "from-env")
    settings = WorkerSettings(task_queue="from-flag")
    assert settings.cluster_name == "prod" and settings.task_queue == "from-flag"
    assert not settings.uses_tls
    assert WorkerSettings(temporal_api_key="secret").uses_tls


def test_the_temporal_api_key_can_come_from_a_mounted_secret(tmp_path):
    key = tmp_path / "api-key"
    key.write_text("from-the-secret\n")
    settings = WorkerSettings(cluster_name="prod", temporal_api_key_file=key)
    assert settings.uses_tls and settings.temporal_api_key_value() == "from-the-secret"
    assert WorkerSettings(cluster_name="prod", temporal_api_key="inline").temporal_api_key_value() == "inline"
    with pytest.raises(ValidationError, match="not both"):
        WorkerSettings(cluster_name="prod", temporal_api_key="inline", temporal_api_key_file=key)
    with pytest.raises(ValidationError, match="does not exist"):
        WorkerSettings(cluster_name="prod", temporal_api_key_file=tmp_path / "missing")


def test_bad_settings_stop_the_worker_naming_flag_and_variable(monkeypatch, tmp_path):
    monkeypatch.delenv("KARPFLOW_CLUSTER_NAME", raising=False)
    cert = tmp_path / "client.pem"
    cert.write_text("x")
    result = CliRunner().invoke(cli, ["--temporal-tls-cert", str(cert), "--poll-interval", "-1"])
    assert result.exit_code == 2
    assert "--cluster-name / KARPFLOW_CLUSTER_NAME: Field required" in result.output
    assert "--poll-interval / KARPFLOW_POLL_INTERVAL: Input should be greater than 0" in result.output
    result = CliRunner().invoke(cli, ["--cluster-name", "x", "--temporal-tls-cert", str(cert)])
    assert "temporal_tls_cert and temporal_tls_key must be given together" in result.output


def test_kubernetes_errors_are_classified():
    assert classify_kube(KubeError(409, "Conflict"), "node a").type == errors.CONFLICT
    assert not classify_kube(KubeError(503, "Unavailable"), "node a").non_retryable
    assert not classify_kube(KubeError(429, "TooManyRequests"), "node a").non_retryable
    forbidden = classify_kube(KubeError(403, "Forbidden", '{"message": "nodes is forbidden"}'), "node a")
    assert forbidden.non_retryable and forbidden.message == "node a: Kubernetes API 403: nodes is forbidden"
    assert classify_kube(KubeError(422, "Invalid"), "node a").type == errors.INVALID
    assert classify_kube(ConnectionRefusedError(), "node a").type == errors.UNAVAILABLE


def test_ec2_errors_are_classified():
    def client_error(code: str, status: int = 400) -> ClientError:
        response = {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}
        return ClientError(response, "RunInstances")

    assert (
        classify_ec2(client_error("InsufficientInstanceCapacity"), "x").type == errors.INSUFFICIENT_CAPACITY
    )
    assert not classify_ec2(client_error("RequestLimitExceeded", 503), "x").non_retryable
    assert classify_ec2(client_error("UnauthorizedOperation", 403), "x").type == errors.FORBIDDEN
    assert classify_ec2(client_error("InvalidAMIID.NotFound"), "x").type == errors.NOT_FOUND
    assert classify_ec2(client_error("InternalError", 500), "x").type == errors.SERVER_ERROR
    assert classify_ec2(EndpointConnectionError(endpoint_url="http://x"), "x").type == errors.UNAVAILABLE
    assert classify_ec2(ParamValidationError(report="bad"), "x").type == errors.INVALID


def test_log_lines_are_json_with_the_workflow_ids():
    record = logging.LogRecord("temporalio.workflow", logging.INFO, __file__, 1, "taint %s", ("a",), None)
    record.temporal_workflow = {
        "workflow_id": "termination/a",
        "run_id": "r1",
        "workflow_type": "TerminationWorkflow",
    }
    TemporalContextFilter().filter(record)
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "taint a" and line["workflow_id"] == "termination/a" and line["run_id"] == "r1"


def test_text_log_lines_carry_the_context_once():
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    configure_logging(WorkerSettings(cluster_name="c", log_format="text"))
    try:
        handler = logging.getLogger().handlers[0]
        plain = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", (), None)
        handler.filter(plain)
        assert handler.format(plain).endswith("INFO x hello")
        from_sdk = logging.LogRecord(
            "temporalio.workflow", logging.INFO, __file__, 1, "hi ({'workflow_id': 'w'})", (), None
        )
        from_sdk.temporal_workflow = {"workflow_id": "w"}
        handler.filter(from_sdk)
        assert handler.format(from_sdk).count("'workflow_id'") == 1
    finally:
        root.handlers[:], root.level = saved[0], saved[1]


def test_the_uids_of_nodes_a_command_no_longer_has_pin_nothing():
    """Validation may narrow an emptiness command to the nodes still valid; the input keeps the UIDs
    the planner gave every node (activities/planning.py validate_commands)."""
    narrowed = parse_input(
        DisruptionInput, {"reason": "Empty", "nodes": ["a"], "node_uids": {"a": "uid-a", "b": "uid-b"}}
    )
    assert narrowed.node_uids == {"a": "uid-a"}


def test_drift_per_pass_defaults_to_the_planners_and_reaches_it_from_the_environment(monkeypatch):
    from planner.model import PlanOptions

    monkeypatch.setenv("KARPFLOW_CLUSTER_NAME", "prod")
    assert WorkerSettings().drift_per_pass == PlanOptions().drift_commands_per_pass
    monkeypatch.setenv("KARPFLOW_DRIFT_PER_PASS", "1")  # Karpenter's pace
    assert WorkerSettings().drift_per_pass == 1
    with pytest.raises(ValidationError):
        WorkerSettings(drift_per_pass=0)
