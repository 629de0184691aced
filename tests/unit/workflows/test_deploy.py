"""deploy/: the overlays build with the real kubectl, name only settings the worker knows, and the IAM
policy grants the EC2 calls activities/ec2.py makes (RBAC is checked against recorded calls in
the integration tests)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from runtime.settings import WorkerSettings

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
OVERLAYS = sorted(p.name for p in (DEPLOY / "overlays").iterdir())


def build(overlay: str) -> list[dict]:
    if shutil.which("kubectl") is None:
        pytest.fail("kubectl is required on PATH (see the brief)")
    result = subprocess.run(
        ["kubectl", "kustomize", str(DEPLOY / "overlays" / overlay)],
        capture_output=True,
        text=True,
        check=True,
    )
    return [d for d in yaml.safe_load_all(result.stdout) if d]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_builds_and_sets_only_known_settings(overlay):
    objects = build(overlay)
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == sorted(
        [
            "Namespace",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "Deployment",
            "PodDisruptionBudget",
        ]
    )
    config = next(o for o in objects if o["kind"] == "ConfigMap")["data"]
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    names = [*config, *(e["name"] for e in container.get("env", []))]
    fields = {f"KARPFLOW_{name.upper()}" for name in WorkerSettings.model_fields}
    assert names and not [n for n in names if n not in fields]
    # the configmap reference survives kustomize's name hashing
    assert (
        container["envFrom"][0]["configMapRef"]["name"]
        == next(o for o in objects if o["kind"] == "ConfigMap")["metadata"]["name"]
    )
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > float(config["KARPFLOW_GRACEFUL_SHUTDOWN"])


def test_the_iam_policy_grants_every_ec2_call_the_activities_make():
    source = (Path(__file__).resolve().parents[3] / "activities" / "ec2.py").read_text()
    calls = set(re.findall(r'_call\(\s*"(\w+)"', source))
    actions = {"ec2:" + "".join(part.title() for part in call.split("_")) for call in calls}
    policy = json.loads((DEPLOY / "iam-policy.json").read_text())
    granted = set()
    for statement in policy["Statement"]:
        listed = statement["Action"]
        granted.update([listed] if isinstance(listed, str) else listed)
    assert calls >= {"run_instances", "terminate_instances", "describe_instances"}
    assert actions <= granted, sorted(actions - granted)
    terminate = next(s for s in policy["Statement"] if s["Action"] == "ec2:TerminateInstances")
    assert "aws:ResourceTag/kubernetes.io/cluster/CLUSTER_NAME" in terminate["Condition"]["StringEquals"]
