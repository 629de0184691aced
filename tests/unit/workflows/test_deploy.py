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
            "Role",  # the notification webhook's one Secret
            "RoleBinding",
            "ConfigMap",
            "Deployment",
            "PodDisruptionBudget",
            "NetworkPolicy",
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "Service",
        ]
    )
    crds = sorted(o["metadata"]["name"] for o in objects if o["kind"] == "CustomResourceDefinition")
    assert crds == ["maintenancewindows.karpflow.dev", "nodedisruptionbudgets.karpflow.dev"]
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
    # the metrics Service selects the workers and reaches /metrics on their health port
    service = next(o for o in objects if o["kind"] == "Service")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in container["ports"]}
    assert service["metadata"]["annotations"]["prometheus.io/path"] == "/metrics"


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


def test_the_iam_policy_grants_the_eks_and_iam_calls_of_the_launch():
    root = Path(__file__).resolve().parents[3] / "activities"
    calls = {
        ("iam", call)
        for call in re.findall(r"self\.iam\.(\w+)\(", (root / "instance_profiles.py").read_text())
    } | {
        ("eks", call) for call in re.findall(r"self\.eks\.(\w+)", (root / "cluster_endpoint.py").read_text())
    }
    assert ("eks", "describe_cluster") in calls and ("iam", "create_instance_profile") in calls
    granted = set()
    for statement in json.loads((DEPLOY / "iam-policy.json").read_text())["Statement"]:
        listed = statement["Action"]
        granted.update([listed] if isinstance(listed, str) else listed)
    needed = {f"{service}:" + "".join(part.title() for part in call.split("_")) for service, call in calls}
    assert needed <= granted, sorted(needed - granted)


def test_instance_profiles_are_created_and_changed_only_as_this_clusters():
    profile = "arn:aws:iam::111122223333:instance-profile/karpflow_CLUSTER_NAME_0123456789abcdef"
    assert allowed("iam:CreateInstanceProfile", profile, **{OWNED: "owned"})
    assert not allowed("iam:CreateInstanceProfile", profile)
    assert allowed(
        "iam:AddRoleToInstanceProfile",
        profile,
        **{"aws:ResourceTag/kubernetes.io/cluster/CLUSTER_NAME": "owned"},
    )
    assert not allowed("iam:AddRoleToInstanceProfile", profile)
    # Someone else's profile is out of reach, tagged or not.
    other = "arn:aws:iam::111122223333:instance-profile/AdminProfile"
    assert not allowed(
        "iam:AddRoleToInstanceProfile",
        other,
        **{"aws:ResourceTag/kubernetes.io/cluster/CLUSTER_NAME": "owned"},
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_workers_pdb_selects_the_workers_pods(overlay):
    """policy/v1: a PDB without a selector protects nothing (a bug the base once had)."""
    objects = build(overlay)
    (pdb,) = [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    selector = pdb["spec"].get("selector", {}).get("matchLabels")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector and selector.items() <= pod_labels.items(), (selector, pod_labels)
    assert pdb["metadata"]["namespace"] == deployment["metadata"]["namespace"]


# -- IAM: the policy evaluated, not read as text ---------------------------------------------------
# PyPI's evaluators could not do this here: principalmapper does not import on Python 3.11 and moto's
# IAMPolicy treats a missing condition key as satisfied. So: IAM's own rules for what this policy
# uses (Allow statements only; Action/Resource wildcards; StringEquals with every key present).

OWNED = "aws:RequestTag/kubernetes.io/cluster/CLUSTER_NAME"
INSTANCE = "arn:aws:ec2:us-west-2:111122223333:instance/i-0123"
SPOT_REQUEST = "arn:aws:ec2:us-west-2:111122223333:spot-instances-request/sir-0123"


def _matches(patterns: str | list[str], value: str) -> bool:
    patterns = [patterns] if isinstance(patterns, str) else patterns
    return any(re.fullmatch(re.escape(p).replace(r"\*", ".*").replace(r"\?", "."), value) for p in patterns)


def _condition_holds(condition: dict, context: dict[str, str]) -> bool:
    for operator, pairs in condition.items():
        assert operator in ("StringEquals", "StringLike"), f"the evaluator does not know {operator}"
        for key, allowed in pairs.items():
            allowed = [allowed] if isinstance(allowed, str) else allowed
            if key not in context:  # IAM: a condition on a key the request lacks does not hold
                return False
            if operator == "StringEquals" and context[key] not in allowed:
                return False
            if operator == "StringLike" and not _matches(allowed, context[key]):
                return False
    return True


def allowed(action: str, resource: str, **context: str) -> bool:
    policy = json.loads((DEPLOY / "iam-policy.json").read_text())
    for statement in policy["Statement"]:
        assert statement["Effect"] == "Allow"
        if (
            _matches(statement["Action"], action)
            and _matches(statement["Resource"], resource)
            and _condition_holds(statement.get("Condition", {}), context)
        ):
            return True
    return False


POOL = "aws:RequestTag/karpenter.sh/nodepool"


def test_instances_are_launched_and_tagged_only_as_this_clusters():
    ours = {OWNED: "owned", POOL: "default"}
    at_launch = {"ec2:CreateAction": "RunInstances", **ours}
    assert allowed("ec2:RunInstances", INSTANCE, **ours)
    assert not allowed("ec2:RunInstances", INSTANCE)
    assert not allowed("ec2:RunInstances", INSTANCE, **{OWNED: "owned"})  # launched for a NodePool only
    assert allowed("ec2:CreateTags", INSTANCE, **at_launch)
    assert allowed("ec2:CreateTags", SPOT_REQUEST, **at_launch)  # spot requests are tagged at launch
    eni = "arn:aws:ec2:us-west-2:111122223333:network-interface/eni-0123"
    assert allowed("ec2:CreateTags", eni, **at_launch)  # and so are network interfaces
    assert allowed("ec2:RunInstances", SPOT_REQUEST, **ours)
    # The hole this closes: stamping the ownership tag on someone else's running instance.
    assert not allowed("ec2:CreateTags", INSTANCE, **ours)
    assert not allowed("ec2:CreateTags", INSTANCE, **{"ec2:CreateAction": "RunInstances"})


def test_only_instances_launched_for_a_nodepool_of_this_cluster_can_be_terminated():
    """The cluster tag alone is not enough: EKS managed node groups put it on their instances too."""
    owned = {"aws:ResourceTag/kubernetes.io/cluster/CLUSTER_NAME": "owned"}
    assert allowed(
        "ec2:TerminateInstances", INSTANCE, **owned, **{"aws:ResourceTag/karpenter.sh/nodepool": "gpu"}
    )
    assert not allowed("ec2:TerminateInstances", INSTANCE, **owned)
    assert not allowed("ec2:TerminateInstances", INSTANCE)


def test_the_interruption_queue_overlay_polls_the_queue_the_iam_policy_lets_it_read():
    objects = build("interruption-queue")
    config = next(o for o in objects if o["kind"] == "ConfigMap")["data"]
    queue = config["KARPFLOW_INTERRUPTION_QUEUE"]
    settings = WorkerSettings(cluster_name=config["KARPFLOW_CLUSTER_NAME"], interruption_queue=queue)
    assert settings.interruption_queue == queue
    # deploy/iam-policy.json grants the queue named after the cluster (arn:aws:sqs:*:*:CLUSTER_NAME).
    assert queue.rsplit("/", 1)[-1] == config["KARPFLOW_CLUSTER_NAME"]
    statement = next(
        s
        for s in json.loads((DEPLOY / "iam-policy.json").read_text())["Statement"]
        if s["Sid"] == "InterruptionQueue"
    )
    assert statement["Resource"].endswith(":CLUSTER_NAME") and "sqs:ReceiveMessage" in statement["Action"]
    # The other overlays do not poll: interruption handling is switched on by setting the queue.
    for overlay in set(OVERLAYS) - {"interruption-queue"}:
        assert (
            "KARPFLOW_INTERRUPTION_QUEUE"
            not in next(o for o in build(overlay) if o["kind"] == "ConfigMap")["data"]
        )


def test_the_image_every_overlay_runs_is_the_release_of_this_version():
    """What a release must publish: ghcr.io/karpflow/karpflow:<pyproject version>, built from
    deploy/Dockerfile (docs/deploy.md)."""
    version = re.search(r'^version = "([^"]+)"', (DEPLOY.parent / "pyproject.toml").read_text(), re.M)
    assert version is not None
    for overlay in OVERLAYS:
        deployment = next(o for o in build(overlay) if o["kind"] == "Deployment")
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert container["image"] == f"ghcr.io/karpflow/karpflow:{version[1]}", overlay
