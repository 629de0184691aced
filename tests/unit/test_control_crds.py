"""The CRDs of deploy/crds say what a schema can say about MaintenanceWindows and
NodeDisruptionBudgets, and agree with the pydantic models of api/.

Each object is checked as kube-apiserver would: the OpenAPI schema (jsonschema, as the emulator
does) and every CEL rule (`x-kubernetes-validations`) evaluated with cel-python on the value it is
attached to. The emulator will enforce the CEL rules itself once it evaluates them; until then this
is where they are proven.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import celpy
import jsonschema
import pytest
import yaml
from pydantic import ValidationError

from api.maintenance_window import MaintenanceWindow
from api.node_disruption_budget import NodeDisruptionBudget

CRDS = Path(__file__).resolve().parents[2] / "deploy" / "crds"
MODELS = {"MaintenanceWindow": MaintenanceWindow, "NodeDisruptionBudget": NodeDisruptionBudget}


def schema_of(kind: str) -> dict[str, Any]:
    for path in CRDS.glob("*.karpflow.dev.yaml"):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["kind"] == kind:
            (version,) = crd["spec"]["versions"]
            return version["schema"]["openAPIV3Schema"]
    raise AssertionError(f"no CRD for {kind} in {CRDS}")


_ENV = celpy.Environment()


def cel_errors(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """The messages of the CEL rules `value` breaks, walking the schema as the API server does."""
    errors = []
    for rule in schema.get("x-kubernetes-validations") or ():
        program = _ENV.program(_ENV.compile(rule["rule"]))
        if not program.evaluate({"self": celpy.json_to_cel(value)}):
            errors.append(f"{path or '<root>'}: {rule['message']}")
    if isinstance(value, dict):
        for key, child in (schema.get("properties") or {}).items():
            if key in value and value[key] is not None:
                errors += cel_errors(child, value[key], f"{path}.{key}" if path else key)
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            errors += cel_errors(schema["items"], item, f"{path}[{index}]")
    return errors


def api_server_errors(obj: dict[str, Any]) -> list[str]:
    schema = schema_of(obj["kind"])
    errors = [e.message for e in jsonschema.Draft4Validator(schema).iter_errors(obj)]
    return errors + (cel_errors(schema, obj) if not errors else [])


def model_accepts(obj: dict[str, Any]) -> bool:
    try:
        MODELS[obj["kind"]].model_validate(obj)
    except ValidationError:
        return False
    return True


def window(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "karpflow.dev/v1alpha1",
        "kind": "MaintenanceWindow",
        "metadata": {"name": "w"},
        "spec": spec,
    }


def ndb(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "karpflow.dev/v1alpha1",
        "kind": "NodeDisruptionBudget",
        "metadata": {"name": "n"},
        "spec": spec,
    }


GOOD = [
    window({"actions": ["Consolidation", "Drift"]}),
    window(
        {
            "schedules": [{"cron": "0 9 * * 1-5", "duration": "8h"}, {"cron": "@daily", "duration": "1h30m"}],
            "actions": ["Expiration"],
            "selector": [
                {"key": "karpenter.sh/nodepool", "operator": "In", "values": ["default"]},
                {"key": "example.com/tier", "operator": "Exists"},
                {"key": "karpenter.k8s.aws/instance-cpu", "operator": "Gt", "values": ["4"]},
            ],
        }
    ),
    window(
        {
            "mode": "Allow",
            "timeZone": "Europe/Berlin",
            "schedules": [{"cron": "0 2 * * 2", "duration": "3h"}],
            "exclusions": [
                {"start": "2026-11-26T00:00:00-05:00", "end": "2026-11-30T23:59:00-05:00", "reason": "freeze"}
            ],
            "actions": ["Drift"],
        }
    ),
    window(
        {
            "exclusions": [{"start": "2026-12-24T00:00:00Z", "end": "2026-12-27T00:00:00Z"}],
            "actions": ["Drift"],
        }
    ),
    ndb({"selector": {"matchLabels": {"role": "ingress"}}, "maxUnavailable": 1}),
    ndb(
        {
            "selector": {"matchExpressions": [{"key": "role", "operator": "In", "values": ["a"]}]},
            "minAvailable": "80%",
        }
    ),
    ndb({"maxUnavailable": "100%"}),  # selects nothing, and is valid
    ndb({"maxUnavailable": 0}),
]

# (object, what the API server says): refused by the CRD, and by the model too.
BAD = [
    (window({"actions": []}), "[] "),  # "is too short" or "should be non-empty", by jsonschema version
    (window({"actions": ["Consolidaton"]}), "'Consolidaton' is not one of"),
    (
        window({"schedules": [{"cron": "0 9 * * 1-5"}], "actions": ["Drift"]}),
        "'duration' is a required property",
    ),
    (window({"schedules": [{"cron": "0 9 * *", "duration": "1h"}], "actions": ["Drift"]}), "does not match"),
    (
        window({"schedules": [{"cron": "@fortnightly", "duration": "1h"}], "actions": ["Drift"]}),
        "does not match",
    ),
    (
        window({"schedules": [{"cron": "@daily", "duration": "8 hours"}], "actions": ["Drift"]}),
        "does not match",
    ),
    (window({"schedules": [{"cron": "@daily", "duration": "0s"}], "actions": ["Drift"]}), "longer than 0s"),
    (window({"actions": ["Drift"], "selector": [{"key": "a", "operator": "In"}]}), "In needs at least one"),
    (
        window({"actions": ["Drift"], "selector": [{"key": "a", "operator": "Exists", "values": ["x"]}]}),
        "take no values",
    ),
    (
        window({"actions": ["Drift"], "selector": [{"key": "a", "operator": "Gt", "values": ["x"]}]}),
        "one integer value",
    ),
    (window({"actions": ["Drift"], "selector": [{"key": "a", "operator": "Near"}]}), "'Near' is not one of"),
    (window({"mode": "Allow", "actions": ["Drift"]}), "mode Allow needs at least one schedule"),
    (window({"mode": "Sometimes", "actions": ["Drift"]}), "'Sometimes' is not one of"),
    (
        window(
            {
                "exclusions": [{"start": "2026-12-24T00:00:00Z", "end": "2026-12-23T00:00:00Z"}],
                "actions": ["Drift"],
            }
        ),
        "end must be after start",
    ),
    (
        window({"exclusions": [{"start": "2026-12-24T00:00:00Z"}], "actions": ["Drift"]}),
        "'end' is a required",
    ),
    (ndb({"selector": {}, "minAvailable": 1, "maxUnavailable": 1}), "exactly one of"),
    (ndb({"selector": {}}), "exactly one of"),
    (ndb({"maxUnavailable": "120%"}), "0% to 100%"),
    (ndb({"minAvailable": -1}), "0% to 100%"),
    (ndb({"minAvailable": "half"}), "0% to 100%"),
]


@pytest.mark.parametrize("obj", GOOD, ids=lambda o: str(o["spec"])[:60])
def test_the_crds_and_the_models_accept_valid_objects(obj):
    assert api_server_errors(obj) == []
    assert model_accepts(obj)


@pytest.mark.parametrize(("obj", "expected"), BAD, ids=[e for _, e in BAD])
def test_the_crds_and_the_models_refuse_what_a_schema_can_say(obj, expected):
    errors = api_server_errors(obj)
    assert any(expected in e for e in errors), errors
    assert not model_accepts(obj)


@pytest.mark.parametrize(
    "spec",
    [
        # hour 25 has five fields: only a cron parser sees it; karpflow reports it and fails closed
        {"schedules": [{"cron": "0 25 * * *", "duration": "1h"}], "actions": ["Drift"]},
        # a zone name of the right shape that the tz database does not know
        {
            "timeZone": "Europe/Atlantis",
            "schedules": [{"cron": "0 1 * * *", "duration": "1h"}],
            "actions": ["Drift"],
        },
    ],
)
def test_what_only_karpflow_can_judge_passes_the_schema_and_fails_the_model(spec):
    obj = window(spec)
    assert api_server_errors(obj) == []
    assert not model_accepts(obj)


def test_every_cel_rule_compiles_and_carries_a_message():
    rules = []

    def walk(schema: dict[str, Any]) -> None:
        rules.extend(schema.get("x-kubernetes-validations") or ())
        for child in (schema.get("properties") or {}).values():
            walk(child)
        if "items" in schema:
            walk(schema["items"])

    for kind in MODELS:
        walk(schema_of(kind))
    assert len(rules) == 9
    for rule in rules:
        _ENV.compile(rule["rule"])
        assert rule["message"]
