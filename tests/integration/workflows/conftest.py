"""Acceptance tests of the workflows: the real Temporal dev server, the Kubernetes emulator, moto,
karpflow's real worker (in process, or as a subprocess where a test kills it).

Scenarios are built with the simulator's own generator (`sim.scenarios.generate_demo`), so nodes,
pods, PDBs and NodePools look exactly like the demo's.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from api.workflow_ids import termination_workflow_id
from api.workflow_io import TerminationInput
from kube.client import USER_AGENT, KubeApi
from runtime.connections import ensure_search_attributes, with_karpflow_converter
from runtime.settings import WorkerSettings
from sim.scenario import scenario_from_documents
from sim.scenarios import generate_demo as gen
from sim.stack import SimStack
from sim.testing import make_sim_stack, pytest_configure, sim_stack  # noqa: F401
from worker import KarpflowWorker
from workflows.termination import TerminationWorkflow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DemoNode, Workload = gen.DemoNode, gen.Workload


def node(
    ip: str, instance_type: str = "m5.large", zone: str = "us-west-2a", capacity: str = "on-demand"
) -> Any:
    return DemoNode(ip, instance_type, zone, capacity, "default", timedelta(days=3), "test")


def scenario(nodes: list[Any], workloads: list[Any], termination_grace_period: str | None = None) -> Any:
    """A scenario in the demo's shape; the NodePool gets a terminationGracePeriod when asked."""
    nodes = [replace(n, pods=[]) for n in nodes]
    listing = copy.deepcopy(gen.scenario_list(nodes, workloads))  # the generator shares its NodePool specs
    if termination_grace_period:
        for item in listing["items"]:
            if item["kind"] == "NodePool":
                item["spec"]["template"]["spec"]["terminationGracePeriod"] = termination_grace_period
    return scenario_from_documents([listing], "test scenario")


@pytest_asyncio.fixture(scope="session")
async def dev_client(dev_server_env: WorkflowEnvironment) -> Client:
    """A client with karpflow's data converter, search attributes registered."""
    client = with_karpflow_converter(dev_server_env.client)
    assert await ensure_search_attributes(client)
    return client


@pytest.fixture(scope="session")
def temporal_address(dev_server_env: WorkflowEnvironment) -> str:
    return dev_server_env.client.service_client.config.target_host


WORKER_NAMESPACE, WORKER_ACCOUNT = "karpflow", "karpflow-worker"
IDENTITY_KINDS = ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding")


@pytest.fixture(scope="session")
def worker_identity_objects() -> list[dict[str, Any]]:
    """deploy/base's Namespace, ServiceAccount, ClusterRole and binding, as kustomize renders them."""
    rendered = subprocess.run(
        ["kubectl", "kustomize", os.path.join(REPO, "deploy", "base")],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [d for d in yaml.safe_load_all(rendered) if d and d["kind"] in IDENTITY_KINDS]


@dataclass
class WorkerIdentity:
    """What a pod of the Deployment has: its ServiceAccount's token and the cluster CA, as files."""

    token_file: Path
    ca_file: Path


def grant_worker_identity(stack: SimStack, objects: list[dict[str, Any]], directory: Path) -> WorkerIdentity:
    """Store the rendered RBAC and write the ServiceAccount's token: the worker then runs with
    exactly deploy/base's rights, enforced by the secure emulator."""
    plural = {"Namespace": "namespaces", "ServiceAccount": "serviceaccounts"}
    plural |= {"ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings"}
    for obj in objects:
        if obj["kind"] == "Namespace" and obj["metadata"]["name"] in {
            o["metadata"]["name"] for o in stack.store.list("namespaces").items
        }:
            continue
        stack.store.create(plural[obj["kind"]], copy.deepcopy(obj))
    directory.mkdir(parents=True, exist_ok=True)
    token_file = directory / "token"
    token_file.write_text(stack.service_account_token(WORKER_NAMESPACE, WORKER_ACCOUNT, seconds=24 * 3600))
    return WorkerIdentity(token_file, Path(stack.ca_file))  # type: ignore[arg-type]


@dataclass
class Karpflow:
    """One test's world: a simulated cluster, a worker on a task queue of its own, and helpers.
    The stack is secure unless the test says otherwise: the worker (in process or as a process)
    authenticates as ServiceAccount karpflow/karpflow-worker and has only deploy/base's ClusterRole."""

    stack: SimStack
    client: Client
    kube: KubeApi
    task_queue: str
    temporal_address: str
    log_dir: Path
    identity: WorkerIdentity | None = None

    def kube_settings(self) -> dict[str, Any]:
        values: dict[str, Any] = {"kube_api_server": self.stack.kube_url}
        if self.identity is not None:
            values |= {"kube_token_file": self.identity.token_file, "kube_ca_file": self.identity.ca_file}
        return values

    def settings(self, **overrides: Any) -> WorkerSettings:
        values: dict[str, Any] = {
            "cluster_name": self.stack.cluster_name,
            "task_queue": self.task_queue,
            "temporal_address": self.temporal_address,
            **self.kube_settings(),
            "cluster_endpoint": self.stack.kube_url,
            "cluster_ca_bundle": self.stack.ca_bundle,
            "service_cidr": self.stack.service_cidr,
            "aws_endpoint_url": self.stack.ec2_endpoint,
            "aws_region": self.stack.region,
            "poll_interval": 0.05,
            "ec2_poll_interval": 0.05,
            "health": False,
            "register_search_attributes": False,
            "graceful_shutdown": 0,
            # These tests drive the workflows by hand; tests/integration/controller/ runs the controller.
            "controller": False,
            **overrides,
        }
        return WorkerSettings(**values)

    @contextlib.asynccontextmanager
    async def worker(self, **overrides: Any) -> AsyncIterator[KarpflowWorker]:
        async with KarpflowWorker(
            self.settings(**overrides), client=self.client, ec2=self.stack.ec2_client()
        ) as w:
            yield w

    def worker_process(self, **env: str) -> subprocess.Popen[bytes]:
        """`karpflow worker` as a real process, configured only through the environment; its log
        goes to `log_dir/worker-<pid>.log`."""
        environment = {
            **os.environ,
            **self.stack.client_env(),
            "KARPFLOW_TEMPORAL_ADDRESS": self.temporal_address,
            "KARPFLOW_TASK_QUEUE": self.task_queue,
            "KARPFLOW_POLL_INTERVAL": "0.05",
            "KARPFLOW_EC2_POLL_INTERVAL": "0.05",
            "KARPFLOW_HEALTH_PORT": "0",
            "KARPFLOW_REGISTER_SEARCH_ATTRIBUTES": "false",
            "KARPFLOW_STICKY_QUEUE_TIMEOUT": "1",
            "KARPFLOW_CONTROLLER": "false",
            **{f"KARPFLOW_{k.upper()}": str(v) for k, v in self.kube_settings().items()},
            **env,
        }
        environment.pop("KUBECONFIG", None)  # the admin's: the worker has its own identity
        log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - handed to the child process
            "wb", dir=self.log_dir, prefix="worker-", suffix=".log", delete=False
        )
        with log:
            return subprocess.Popen(
                [sys.executable, "-m", "cli", "worker"], cwd=REPO, env=environment, stdout=log, stderr=log
            )

    def worker_logs(self) -> str:
        return "\n".join(
            f"== {p.name}\n{p.read_text()[-4000:]}" for p in sorted(self.log_dir.glob("worker-*.log"))
        )

    # -- looking at the world -----------------------------------------------------------------

    def instances(self, states: tuple[str, ...] = ("pending", "running")) -> list[dict[str, Any]]:
        ec2 = self.stack.ec2_client()
        response = ec2.describe_instances(
            Filters=[
                {"Name": f"tag:kubernetes.io/cluster/{self.stack.cluster_name}", "Values": ["owned"]},
                {"Name": "instance-state-name", "Values": list(states)},
            ]
        )
        return [i for r in response["Reservations"] for i in r["Instances"]]

    async def nodes(self) -> dict[str, dict[str, Any]]:
        return {n["metadata"]["name"]: n for n in (await self.kube.list_nodes())["items"]}

    async def pods(self) -> list[dict[str, Any]]:
        return (await self.kube.request("GET", "/api/v1/pods"))["items"]

    async def run(self, *argv: str, check: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
        """A real command (temporal, kubectl) without blocking the worker that runs in this loop."""
        environment = {**os.environ, **env}
        result = await asyncio.to_thread(
            subprocess.run,
            list(argv),
            capture_output=True,
            text=True,
            timeout=60,
            env=environment,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
        return result

    async def eventually(
        self, check: Callable[[], Awaitable[Any]], within: float = 30, what: str | Callable[[], str] = ""
    ) -> Any:
        deadline = time.monotonic() + within
        while True:
            value = await check()
            if value:
                return value
            if time.monotonic() > deadline:
                text = what() if callable(what) else what
                raise AssertionError(f"timed out after {within}s waiting for {text or check}")
            await asyncio.sleep(0.05)

    async def termination_id(self, node: str) -> str:
        """The id every part of karpflow gives the termination of `node` as it is now (its UID)."""
        uid = (await self.nodes())[node]["metadata"]["uid"]
        return termination_workflow_id(self.stack.cluster_name, node, uid)

    async def start_termination(self, node: str, reason: str = "Drifted") -> WorkflowHandle[Any, Any]:
        """A TerminationWorkflow of `node` on this test's task queue, pinned to it, under its real id."""
        uid = (await self.nodes())[node]["metadata"]["uid"]
        return await self.client.start_workflow(
            TerminationWorkflow.run,
            TerminationInput(node=node, uid=uid, reason=reason),
            id=termination_workflow_id(self.stack.cluster_name, node, uid),
            task_queue=self.task_queue,
        )

    def workflow_id(self, prefix: str) -> str:
        return f"{prefix}/{uuid.uuid4().hex[:8]}"

    async def cleanup(self) -> None:
        """Terminate what this test left running: the tests' stacks share a cluster name, so a node
        name and UID could meet again in a workflow id."""
        query = f'TaskQueue="{self.task_queue}" AND ExecutionStatus="Running"'
        async for execution in self.client.list_workflows(query):
            with contextlib.suppress(Exception):
                await self.client.get_workflow_handle(execution.id, run_id=execution.run_id).terminate(
                    "test over"
                )


@pytest_asyncio.fixture
async def karpflow(
    make_sim_stack,  # noqa: F811 - the fixture imported above
    dev_client,
    temporal_address,
    worker_identity_objects,
    request,
    tmp_path,
) -> AsyncIterator[Karpflow]:
    """Configure the stack with `@pytest.mark.sim_stack(scenario=..., ...)` (time scale 0.01: the
    invariant checker's bounds are simulated time, so they need a non-zero scale). Stacks are secure
    and the worker runs as its ServiceAccount with deploy/base's RBAC, unless the marker says
    `secure=False`; `@pytest.mark.rbac_by_test` leaves the RBAC objects for the test to apply."""
    marker = request.node.get_closest_marker("sim_stack")
    kwargs = {"time_scale": 0.01, "secure": True, **(marker.kwargs if marker else {})}
    stack = await asyncio.to_thread(make_sim_stack, **kwargs)
    identity = None
    if stack.tls is not None and request.node.get_closest_marker("rbac_by_test") is None:
        identity = grant_worker_identity(stack, worker_identity_objects, tmp_path / "serviceaccount")
    ca_file = str(stack.ca_file) if stack.ca_file else None
    kube = KubeApi.for_host(
        stack.kube_url, user_agent="karpflow-tests", token=stack.admin_token, ca_file=ca_file
    )
    world = Karpflow(
        stack, dev_client, kube, f"it-{uuid.uuid4().hex[:8]}", temporal_address, tmp_path, identity
    )
    try:
        yield world
        if identity is not None:
            # The rendered ClusterRole was enough for everything this test had the worker do.
            refused = [
                (r.method, r.path, r.status, r.user)
                for r in stack.requests.query()
                if (r.user_agent or "").startswith(USER_AGENT) and r.status in (401, 403)
            ]
            assert not refused, f"deploy/base/rbac.yaml refused the worker: {refused}"
    finally:
        await world.cleanup()
        await kube.close()


def worker_requests(stack: SimStack) -> set[tuple[str, str]]:
    """(verb, resource) of every Kubernetes request karpflow's worker made (by its user agent). A
    request for a kind the server does not serve (the cache's optional kinds: seed-era Provisioners)
    names no resource the emulator knows: its 404 asks for no right."""
    return {
        (r.verb or "", r.resource or "")
        for r in stack.requests.query()
        if (r.user_agent or "").startswith(USER_AGENT) and (r.verb or r.status != 404)
    }


def assert_rbac_allows(requests: set[tuple[str, str]]) -> None:
    """deploy/base/rbac.yaml grants every call the worker made, so the manifests stay honest."""
    documents = yaml.safe_load_all(Path(REPO, "deploy", "base", "rbac.yaml").read_text())
    role = next(d for d in documents if d["kind"] == "ClusterRole")
    granted = {
        (verb, resource) for rule in role["rules"] for verb in rule["verbs"] for resource in rule["resources"]
    }
    missing = sorted(request for request in requests if request not in granted)
    assert requests and not missing, f"deploy/base/rbac.yaml does not grant {missing}"


async def wait_closed(
    client: Client, workflow_id: str, within: float = 30, since: datetime | None = None
) -> WorkflowExecutionStatus:
    """The status of the latest run of `workflow_id` once closed; with `since`, only a run started
    after it counts (a test may reuse a node name, hence a workflow id, of an earlier test)."""
    deadline = time.monotonic() + within
    while True:
        try:
            described = await client.get_workflow_handle(workflow_id).describe()
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            described = None
        fresh = described is not None and (since is None or described.start_time >= since)
        if fresh and described.status != WorkflowExecutionStatus.RUNNING:
            return described.status
        if time.monotonic() > deadline:
            raise AssertionError(f"{workflow_id} not closed after {within}s")
        await asyncio.sleep(0.05)
