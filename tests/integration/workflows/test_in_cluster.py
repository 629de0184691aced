"""The worker as its Deployment runs it in a cluster, proven on a secure local stack.

`kubectl apply -k` of an operator's overlay (deploy/overlays/local with this stack's addresses) on
an emulator that serves HTTPS and enforces RBAC; then `karpflow worker` started with exactly the
container's command, args and env from the stored Deployment and ConfigMap, and what a pod gets
(KUBERNETES_SERVICE_HOST/PORT, a ServiceAccount token from `kubectl create token`, the CA). Every
request it makes is authenticated as its ServiceAccount and authorized by the rendered ClusterRole.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from temporalio.client import WorkflowFailureError

from api.constants import DISRUPTED_TAINT_KEY
from api.workflow_io import DisruptionInput, DisruptionTimeouts, ReplacementSpec
from sim import dev_identity
from sim.apiserver.resources import all_resources
from sim.binaries import temporal_cli
from sim.stack import SimStack
from sim.testing import assert_no_violations, kubectl
from tests.integration.workflows.conftest import REPO, Karpflow, Workload, node, scenario
from workflows.disruption import DisruptionWorkflow

pytestmark = pytest.mark.integration

OVERLAY = Path(REPO, "deploy", "overlays", "local")
NAMESPACE, ACCOUNT = "karpflow", "karpflow-worker"
SERVICE_ACCOUNT = f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"
A, B = node("172.31.1.10", "m5.xlarge"), node("172.31.2.20", "m5.xlarge")
PODS = [Workload("shop", "web", "100m", "128Mi", ["10"] * 6, pdb={"maxUnavailable": 2})]


def operators_overlay(directory: Path, values: dict[str, str]) -> Path:
    """What an operator writes: deploy/overlays/local plus this cluster's addresses."""
    directory.mkdir(parents=True)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(OVERLAY, directory)],
        "configMapGenerator": [
            {
                "name": "karpflow-worker",
                "behavior": "merge",
                "literals": [f"{key}={value}" for key, value in values.items()],
            }
        ],
    }
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return directory


def stack_values(karpflow: Karpflow) -> dict[str, str]:
    stack = karpflow.stack
    return {
        "KARPFLOW_CLUSTER_NAME": stack.cluster_name,
        "KARPFLOW_TEMPORAL_ADDRESS": karpflow.temporal_address,
        "KARPFLOW_TASK_QUEUE": karpflow.task_queue,
        "KARPFLOW_AWS_REGION": stack.region,
        "KARPFLOW_AWS_ENDPOINT_URL": stack.ec2_endpoint,
        "KARPFLOW_CLUSTER_ENDPOINT": stack.kube_url,
        "KARPFLOW_SERVICE_CIDR": stack.service_cidr,
        "KARPFLOW_HEALTH_PORT": "0",  # tests share the machine; the probes' port is not under test
        "KARPFLOW_GRACEFUL_SHUTDOWN": "0",
        # The stack runs at 1/100 of real time; the test starts its disruptions itself.
        "KARPFLOW_POLL_INTERVAL": "0.05",
        "KARPFLOW_EC2_POLL_INTERVAL": "0.05",
        "KARPFLOW_CONTROLLER": "false",
    }


@dataclass
class Container:
    argv: list[str]
    env: dict[str, str]


def entrypoint() -> list[str]:
    """The image's ENTRYPOINT (deploy/Dockerfile), which the Deployment does not override."""
    for line in Path(REPO, "deploy", "Dockerfile").read_text().splitlines():
        if line.startswith("ENTRYPOINT"):
            return json.loads(line.removeprefix("ENTRYPOINT").strip())
    raise AssertionError("deploy/Dockerfile has no ENTRYPOINT")


def container_from_cluster(stack: SimStack) -> Container:
    """The worker container as a kubelet would start it: command, args, env (ConfigMaps resolved),
    read back from what `kubectl apply` stored."""
    deployment = json.loads(kubectl(stack, "get", "deployment", ACCOUNT, "-n", NAMESPACE, "-o", "json"))
    spec = deployment["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == ACCOUNT
    (container,) = spec["containers"]
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        name = source["configMapRef"]["name"]
        config = json.loads(kubectl(stack, "get", "configmap", name, "-n", NAMESPACE, "-o", "json"))
        env.update(config["data"])
    for variable in container.get("env", []):
        env[variable["name"]] = variable["value"]
    command = container.get("command") or entrypoint()
    # The image's `karpflow` is this environment's console script (the same wheel entry point).
    executable = str(Path(sys.executable).parent / command[0])
    return Container([executable, *command[1:], *container.get("args", [])], env)


def pod_environment(stack: SimStack, mounts: Path) -> dict[str, str]:
    """What Kubernetes adds to every pod, and what IRSA would give for AWS (moto takes anything).
    The token and CA sit where the test chose; the worker reads them through its settings."""
    mounts.mkdir(parents=True, exist_ok=True)
    token = kubectl(stack, "create", "token", ACCOUNT, "-n", NAMESPACE, "--duration", "1h").strip()
    (mounts / "token").write_text(token)
    (mounts / "ca.crt").write_bytes(Path(stack.ca_file).read_bytes())  # type: ignore[arg-type]
    return {
        **dev_identity.pod_env(stack.kube_url, mounts),
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "PATH": os.environ["PATH"],
        "HOME": str(mounts),
    }


def start_worker(container: Container, pod: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """No KUBECONFIG, no inherited environment: only what the pod would have."""
    with log.open("wb") as out:
        return subprocess.Popen(
            container.argv, env={**container.env, **pod}, cwd=log.parent, stdout=out, stderr=out
        )


def replace_nodes(*nodes: str, **timeouts: Any) -> DisruptionInput:
    return DisruptionInput(
        reason="Drifted",
        nodes=list(nodes),
        replacements=[
            ReplacementSpec(nodepool="default", instance_types=["m5.xlarge"], zones=["us-west-2a"])
        ],
        timeouts=DisruptionTimeouts(**timeouts),
    )


async def execute(karpflow: Karpflow, workflow_id: str, command: DisruptionInput) -> Any:
    """`temporal workflow execute`, as an operator starts one by hand."""
    return await karpflow.run(
        temporal_cli(),
        "workflow",
        "execute",
        "--address",
        karpflow.temporal_address,
        "--type",
        "DisruptionWorkflow",
        "--task-queue",
        karpflow.task_queue,
        "--workflow-id",
        workflow_id,
        "--input",
        command.model_dump_json(),
        check=False,
    )


def untainted(nodes: dict[str, dict[str, Any]]) -> bool:
    return not any(
        t["key"] == DISRUPTED_TAINT_KEY for n in nodes.values() for t in n["spec"].get("taints") or ()
    )


def drop_rule(stack: SimStack, which: str | dict[str, Any]) -> None:
    """The ClusterRole as stored, without the rules for resource `which` (or without the one rule
    `which`: two rules may name one resource with different verbs), put back with kubectl."""
    role = json.loads(kubectl(stack, "get", "clusterrole", ACCOUNT, "-o", "json"))
    role["rules"] = [
        rule
        for rule in role["rules"]
        if (rule != which if isinstance(which, dict) else which not in rule["resources"])
    ]
    result = subprocess.run(
        ["kubectl", "--kubeconfig", str(stack.kubeconfig_path), "replace", "-f", "-"],
        input=json.dumps(role),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.rbac_by_test
@pytest.mark.sim_stack(scenario=scenario([A, B], PODS), secure=True)
async def test_the_rendered_deployment_disrupts_as_its_service_account_and_rolls_back_without_a_rule(
    karpflow, tmp_path
):
    stack = karpflow.stack
    overlay = operators_overlay(tmp_path / "overlay", stack_values(karpflow))
    applied = kubectl(stack, "apply", "-k", str(overlay))
    assert f"clusterrole.rbac.authorization.k8s.io/{ACCOUNT} created" in applied
    assert f"deployment.apps/{ACCOUNT} created" in applied
    container = container_from_cluster(stack)
    assert container.argv[1:] == ["worker"]
    assert container.env["KARPFLOW_CLUSTER_NAME"] == stack.cluster_name
    before = {i["InstanceId"] for i in karpflow.instances()}
    worker = start_worker(
        container, pod_environment(stack, tmp_path / "serviceaccount"), tmp_path / "worker.log"
    )
    try:
        # 1. The whole disruption, every call as the ServiceAccount.
        done = await execute(karpflow, "disruption/default/Drifted/in-cluster-a", replace_nodes(A.name))
        log = (tmp_path / "worker.log").read_text()
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{log[-3000:]}"
        handle = karpflow.client.get_workflow_handle_for(
            DisruptionWorkflow.run, "disruption/default/Drifted/in-cluster-a"
        )
        status = await handle.result()
        assert status.phase == "Succeeded", status
        replacement = status.replacements[0].node
        assert set(await karpflow.nodes()) == {B.name, replacement}
        worker_calls = [r for r in stack.requests.query() if r.user == SERVICE_ACCOUNT]
        assert worker_calls, "the worker made no request as its ServiceAccount"
        assert {
            r.user for r in stack.requests.query() if (r.user_agent or "").startswith("karpflow-worker")
        } == {SERVICE_ACCOUNT}
        refused = [(r.method, r.path, r.status) for r in worker_calls if r.status in (401, 403)]
        assert not refused, refused

        # 2. Without the rule that reads EC2NodeClasses the launch is refused, and nothing is lost.
        drop_rule(stack, "ec2nodeclasses")
        failed = await execute(
            karpflow,
            "disruption/default/Drifted/in-cluster-b",
            replace_nodes(B.name, replacement_ready="10s"),
        )
        assert failed.returncode != 0
        with pytest.raises(WorkflowFailureError) as failure:
            await karpflow.client.get_workflow_handle("disruption/default/Drifted/in-cluster-b").result()
        message = failure.value.cause.message
        assert "403" in message and SERVICE_ACCOUNT in message, message
        assert 'cannot get resource "ec2nodeclasses" in API group "karpenter.k8s.aws"' in message, message
        assert "untainted 1 candidate(s)" in message, message
        nodes = await karpflow.nodes()
        assert set(nodes) == {B.name, replacement} and untainted(nodes)
        assert len({i["InstanceId"] for i in karpflow.instances()}) == len(before)
        # The operator's one line: verb, resource, ServiceAccount, and where to grant it.
        await asyncio.sleep(0.2)
        lines = [
            line for line in (tmp_path / "worker.log").read_text().splitlines() if "permission denied" in line
        ]
        assert lines, "the worker logged no permission denied line"
        assert "cannot get resource" in lines[0] and "ec2nodeclasses" in lines[0], lines[0]
        assert SERVICE_ACCOUNT in lines[0] and "deploy/base/rbac.yaml" in lines[0], lines[0]
    finally:
        worker.terminate()
        await asyncio.to_thread(worker.wait, 30)
    assert_no_violations(stack)


# -- least privilege, rule by rule -----------------------------------------------------------------


def served() -> dict[tuple[str, str], Any]:
    """(group, plural) -> type, for the built-in kinds and those the applied CRDs registered
    (karpflow's own, deploy/crds)."""
    return {(rt.group, rt.plural): rt for rt in all_resources()}


def probe(group: str, resource: str, verb: str) -> tuple[str, str, dict[str, Any] | None]:
    """A request the verb authorizes on the resource (method, path, body); the objects need not
    exist: authorization comes before the lookup, so a granted call answers 404 or 200, never 403."""
    plural, _, sub = resource.partition("/")
    rt = served()[(group, plural)]
    prefix = f"/api/{rt.version}" if not group else f"/apis/{group}/{rt.version}"
    scope = f"{prefix}/namespaces/default" if rt.namespaced else prefix
    if verb in ("list", "watch"):
        query = "?watch=true&timeoutSeconds=1" if verb == "watch" else ""
        return "GET", f"{prefix}/{plural}{query}", None
    path = f"{scope}/{plural}/absent"
    if sub == "status":
        body = {"apiVersion": rt.api_version, "kind": rt.kind, "metadata": {"name": "absent"}, "status": {}}
        return {"update": "PUT", "patch": "PATCH"}[verb], f"{path}/status", body
    if sub:
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "absent"}}
        return "POST", f"{path}/{sub}", body
    if verb == "create":
        body = {"apiVersion": "v1", "kind": rt.kind, "metadata": {"name": "probe"}, "involvedObject": {}}
        return "POST", f"{scope}/{plural}", body
    method = {"get": "GET", "update": "PUT", "patch": "PATCH", "delete": "DELETE"}[verb]
    body = (
        {"apiVersion": rt.api_version, "kind": rt.kind, "metadata": {"name": "absent"}}
        if verb in ("update", "patch")
        else None
    )
    return method, path, body


async def call(stack: SimStack, token: str, method: str, path: str, body: Any) -> tuple[int, str]:
    context = ssl.create_default_context(cafile=str(stack.ca_file))
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method,
            stack.kube_url + path,
            json=body,
            ssl=context,
            headers={"Authorization": f"Bearer {token}"},
            timeout=aiohttp.ClientTimeout(total=10),
        ) as response,
    ):
        text = await response.text() if response.status >= 400 else ""
        return response.status, text


@pytest.mark.rbac_by_test
@pytest.mark.sim_stack(secure=True)
async def test_each_rule_of_the_cluster_role_is_needed_for_its_calls(karpflow, tmp_path):
    stack = karpflow.stack
    kubectl(stack, "apply", "-k", str(OVERLAY))
    token = kubectl(stack, "create", "token", ACCOUNT, "-n", NAMESPACE).strip()
    rules = json.loads(kubectl(stack, "get", "clusterrole", ACCOUNT, "-o", "json"))["rules"]
    kinds = served()  # the overlay's CRDs are registered now
    assert ("karpflow.dev", "maintenancewindows") in kinds
    checked: list[str] = []
    for rule in rules:
        (group,) = rule["apiGroups"]
        probes = [
            (resource, verb, probe(group, resource, verb))
            for resource in rule["resources"]
            if (group, resource.partition("/")[0]) in kinds  # seed-era kinds are not served here
            for verb in rule["verbs"]
        ]
        for resource, verb, request in probes:
            status, _ = await call(stack, token, *request)
            assert status != 403, (resource, verb, request, status)
        drop_rule(stack, rule)
        for resource, verb, request in probes:
            status, text = await call(stack, token, *request)
            assert status == 403, (resource, verb, request, status)
            expected = f'User \\"{SERVICE_ACCOUNT}\\" cannot {verb} resource \\"{resource}\\"'
            assert expected in text, (expected, text)
            checked.append(f"{verb} {resource}")
        kubectl(stack, "apply", "-k", str(OVERLAY))  # the rule back for the next round
    # kubectl's three-way merge put every dropped rule back, and a further apply changes nothing
    # (but the PDB: policy/v1's selector has patchStrategy replace, so a real cluster says
    # "configured" for it on every apply too)
    assert json.loads(kubectl(stack, "get", "clusterrole", ACCOUNT, "-o", "json"))["rules"] == rules
    again = kubectl(stack, "apply", "-k", str(OVERLAY)).splitlines()
    assert again and all(
        line.endswith("unchanged") or line == f"poddisruptionbudget.policy/{ACCOUNT} configured"
        for line in again
    ), again
    # every rule was probed, and every served resource in it
    assert len(checked) >= sum(
        len(rule["verbs"])
        for rule in rules
        if any((rule["apiGroups"][0], r) in kinds for r in rule["resources"])
    ), checked
