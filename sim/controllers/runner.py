"""Entry point: start the simulated cluster's controllers as tasks on the emulator's event loop.

    controllers = SimControllers(store, ec2_endpoint="http://127.0.0.1:4566", cluster_name="dev",
                                 timescale=TimeScale(0.1))
    await controllers.start()          # on the loop that serves the emulator
    ...
    await controllers.stop()

or `async with SimControllers(...) as controllers:`, or `await run_controllers(store, ...)` which
returns a started instance. Each controller can be left out with `enabled=` (names in
`CONTROLLERS`); the node lifecycle needs an EC2 endpoint (moto) or a boto3 client, and lists
instances through the EC2 API (`ec2_source="api"`) or straight from moto's backend when moto runs in
this process (`ec2_source="moto"`, ~20x faster per poll and far faster to discover new instances;
`"auto"`, the default, probes which applies; see `ec2_view.py`). boto3 calls run in worker
threads, never on the loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import boto3
from botocore.config import Config

from planner.catalog import Catalog, bundled_catalog
from sim import ec2_faults
from sim.apiserver.store import Store
from sim.controllers.daemonsets import DaemonSetController
from sim.controllers.ec2_view import detect_source
from sim.controllers.informer import Informer
from sim.controllers.instance_types import InstanceTypes
from sim.controllers.kubelet import Kubelets
from sim.controllers.nodes import NodeLifecycleController, NodeTimings
from sim.controllers.noexecute_taints import NoExecuteTaints
from sim.controllers.pdb import PdbStatusController
from sim.controllers.podgc import PodGC
from sim.controllers.scheduler import Scheduler
from sim.controllers.taint_eviction import TaintEviction
from sim.controllers.workloads import DeploymentController, ReplicaSetController
from sim.tasks import cancel_and_wait
from sim.timescale import TimeScale

log = logging.getLogger(__name__)

CONTROLLERS = (
    "nodes",
    "noexecute",
    "tainteviction",
    "scheduler",
    "kubelet",
    "podgc",
    "replicasets",
    "deployments",
    "daemonsets",
    "pdb",
)
# Off unless named: a simulated Karpenter beside karpflow (sim/controllers/karpenter/).
OPTIONAL_CONTROLLERS = ("karpenter",)
INFORMER_RESOURCES = (
    "nodes",
    "pods",
    "replicasets",
    "deployments",
    "daemonsets",
    "poddisruptionbudgets",
    # The scheduler's namespaceSelector and default spread selector (sim/controllers/scheduler.py).
    "namespaces",
    "services",
)


@dataclass
class KarpenterSettings:
    """What the simulated Karpenter is given: the cluster as its settings and DescribeCluster say
    (endpoint, CA, service CIDR), its API identity, EC2, and where to report what it did."""

    bootstrap: Any  # sim.controllers.karpenter.ClusterBootstrap
    api_endpoint: str
    api_token: str
    ec2_endpoint: str | None = None
    ec2: Any = None
    reporter: Any = None  # (invariant, subject, message, details) -> None
    timings: Any = None  # sim.controllers.karpenter.KarpenterTimings


@dataclass
class SimSettings:
    """The knobs, with the defaults the dev stack uses. Delays are base seconds, scaled by `timescale`."""

    cluster_name: str = "karpflow-dev"
    region: str = "us-west-2"
    timescale: TimeScale = field(default_factory=lambda: TimeScale(1.0))
    enabled: frozenset[str] = frozenset(CONTROLLERS)
    node_timings: NodeTimings = field(default_factory=NodeTimings)
    pod_start_seconds: float = 2.0  # bound to a Ready node → Running and Ready
    pdb_resync_seconds: float = 10.0  # real seconds; expires disruptedPods entries


def sim_ec2_client(endpoint: str, region: str) -> Any:
    """A boto3 EC2 client for moto, marked so injected throttling leaves the simulator alone."""
    client = boto3.client(
        "ec2",
        region_name=region,
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(retries={"max_attempts": 3, "mode": "standard"}, max_pool_connections=4),
    )
    return ec2_faults.mark_sim_client(client)


class SimControllers:
    """The selected controllers, sharing one informer, as asyncio tasks."""

    def __init__(
        self,
        store: Store,
        *,
        ec2_endpoint: str | None = None,
        cluster_name: str = "karpflow-dev",
        region: str = "us-west-2",
        timescale: TimeScale | None = None,
        enabled: Iterable[str] | None = None,
        faults: ec2_faults.Ec2Faults | None = None,
        catalog: Catalog | None = None,
        node_timings: NodeTimings | None = None,
        pod_start_seconds: float = 2.0,
        pdb_resync_seconds: float = 10.0,
        ec2_client: Any = None,
        ec2_source: str = "auto",
        api_endpoint: str | None = None,
        api_ca_pem: bytes | None = None,
        karpenter: Any = None,
    ) -> None:
        """`karpenter`: the simulated Karpenter's settings (`KarpenterSettings`), used when "karpenter"
        is among the enabled controllers."""
        chosen = frozenset(CONTROLLERS if enabled is None else enabled)
        unknown = chosen - set(CONTROLLERS) - set(OPTIONAL_CONTROLLERS)
        if unknown:
            known = ", ".join((*CONTROLLERS, *OPTIONAL_CONTROLLERS))
            raise ValueError(f"unknown controller(s) {sorted(unknown)}; choose from {known}")
        if "karpenter" in chosen and (karpenter is None or (ec2_client is None and ec2_endpoint is None)):
            raise ValueError("the karpenter controller needs its settings and an EC2 endpoint")
        self.karpenter = karpenter
        self.settings = SimSettings(
            cluster_name=cluster_name,
            region=region,
            timescale=timescale or store.timescale,
            enabled=chosen,
            node_timings=node_timings or NodeTimings(),
            pod_start_seconds=pod_start_seconds,
            pdb_resync_seconds=pdb_resync_seconds,
        )
        if "nodes" in chosen and ec2_client is None and ec2_endpoint is None:
            raise ValueError("the nodes controller needs ec2_endpoint (moto's URL) or ec2_client")
        if ec2_source not in ("auto", "api", "moto"):
            raise ValueError(
                f"ec2_source must be 'auto', 'api' (EC2 API over HTTP) or 'moto' (moto in this process), "
                f"got {ec2_source!r}"
            )
        self.ec2_source = ec2_source
        self.api_endpoint = api_endpoint  # the URL a booting kubelet must be told (None: not checked)
        self.api_ca_pem = api_ca_pem  # the CA it must be given (a secure stack; None: not checked)
        self.store = store
        self.ec2 = (
            ec2_client
            if ec2_client is not None
            else (sim_ec2_client(ec2_endpoint, region) if ec2_endpoint else None)
        )
        self.faults = faults
        self.catalog = catalog
        self.informer: Informer | None = None
        self.controllers: dict[str, Any] = {}
        self._tasks: list[asyncio.Task[Any]] = []

    # --- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> SimControllers:
        if self._tasks:
            return self
        s = self.settings
        informer = self.informer = Informer(self.store, INFORMER_RESOURCES)
        built: dict[str, Any] = {}
        if "nodes" in s.enabled:
            catalog = self.catalog or bundled_catalog(s.region)
            types = InstanceTypes(catalog, self._describe_types)
            source = await asyncio.to_thread(
                detect_source, self.ec2, s.cluster_name, s.region, self.ec2_source
            )
            log.info("node lifecycle lists instances with %s", type(source).__name__)
            built["nodes"] = NodeLifecycleController(
                self.store,
                informer,
                source,
                cluster_name=s.cluster_name,
                region=s.region,
                timescale=s.timescale,
                instance_types=types,
                faults=self.faults,
                timings=s.node_timings,
                api_endpoint=self.api_endpoint,
                api_ca_pem=self.api_ca_pem,
            )
        if "noexecute" in s.enabled:
            built["noexecute"] = NoExecuteTaints(self.store, informer)
        if "tainteviction" in s.enabled:
            built["tainteviction"] = TaintEviction(self.store, informer, s.timescale)
        if "scheduler" in s.enabled:
            built["scheduler"] = Scheduler(self.store, informer)
        if "kubelet" in s.enabled:
            lifecycle = built.get("nodes")
            built["kubelet"] = Kubelets(
                self.store,
                informer,
                s.timescale,
                s.pod_start_seconds,
                crash_looping=lifecycle.crash_looping
                if isinstance(lifecycle, NodeLifecycleController)
                else None,
            )
        if "podgc" in s.enabled:
            built["podgc"] = PodGC(self.store, informer, s.timescale)
        if "replicasets" in s.enabled:
            built["replicasets"] = ReplicaSetController(self.store, informer)
        if "deployments" in s.enabled:
            built["deployments"] = DeploymentController(self.store, informer)
        if "daemonsets" in s.enabled:
            built["daemonsets"] = DaemonSetController(self.store, informer)
        if "pdb" in s.enabled:
            built["pdb"] = PdbStatusController(self.store, informer, s.pdb_resync_seconds)
        if "karpenter" in s.enabled:
            built["karpenter"] = self._karpenter()
        self.controllers = built
        informer.start()  # replays the current state through every handler
        self._tasks = [asyncio.create_task(self._pump(), name="sim-informer")]
        for name, controller in built.items():
            self._tasks.append(asyncio.create_task(self._guard(name, controller), name=f"sim-{name}"))
        log.info("simulated cluster controllers running: %s", ", ".join(built))
        return self

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        await cancel_and_wait(tasks)
        for controller in self.controllers.values():
            stop = getattr(controller, "stop", None)
            if stop is not None:
                stop()
        if self.informer is not None:
            self.informer.stop()

    async def __aenter__(self) -> SimControllers:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _pump(self) -> None:
        assert self.informer is not None
        while True:
            await self.informer.wait()
            self.informer.sync()

    async def _guard(self, name: str, controller: Any) -> None:
        # A controller that crashes restarts after a pause instead of silently leaving the cluster frozen.
        while True:
            try:
                await controller.run()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("simulated %s controller crashed; restarting in 1 s", name)
                await asyncio.sleep(1.0)

    def _karpenter(self) -> Any:
        from sim.controllers.karpenter import KarpenterNeighbour

        s, given = self.settings, self.karpenter
        return KarpenterNeighbour(
            self.store,
            # A client like karpflow's, not the simulator's own: injected throttling and capacity
            # errors hit it as they would hit Karpenter.
            ec2=given.ec2
            or boto3.client(
                "ec2",
                region_name=s.region,
                endpoint_url=given.ec2_endpoint,
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
            ),
            cluster_name=s.cluster_name,
            region=s.region,
            timescale=s.timescale,
            catalog=self.catalog or bundled_catalog(s.region),
            bootstrap=given.bootstrap,
            api_endpoint=given.api_endpoint,
            api_token=given.api_token,
            api_ca_pem=self.api_ca_pem,
            reporter=given.reporter,
            timings=given.timings,
        )

    def _describe_types(self, names: list[str]) -> list[dict[str, Any]]:
        return self.ec2.describe_instance_types(InstanceTypes=names).get("InstanceTypes", [])

    # --- for the dev stack's endpoints and for tests ------------------------------------------------

    def poll_ec2_now(self) -> None:
        nodes = self.controllers.get("nodes")
        if nodes is not None:
            nodes.poll_now()

    def status(self) -> dict[str, Any]:
        """Counters for `/sim/status`-style endpoints."""
        out: dict[str, Any] = {
            "enabled": sorted(self.controllers),
            "timescale": self.settings.timescale.factor,
        }
        if (nodes := self.controllers.get("nodes")) is not None:
            out["nodes"] = {
                "instances": nodes.summary(),
                "polls": nodes.polls,
                "last_poll_seconds": round(nodes.last_poll_seconds, 3),
            }
        if (sched := self.controllers.get("scheduler")) is not None:
            out["scheduler"] = {"bound": sched.bound, "pending": len(sched.pending)}
        if (kubelet := self.controllers.get("kubelet")) is not None:
            out["kubelet"] = {"started": kubelet.started}
        if (gc := self.controllers.get("podgc")) is not None:
            out["podgc"] = {"deleted": gc.deleted, "quarantined": len(gc.quarantined)}
        if (eviction := self.controllers.get("tainteviction")) is not None:
            out["tainteviction"] = {"deleted": eviction.deleted, "scheduled": len(eviction.scheduled)}
        if (karpenter := self.controllers.get("karpenter")) is not None:
            out["karpenter"] = karpenter.status()
        return out


async def run_controllers(store: Store, **kwargs: Any) -> SimControllers:
    """Build and start `SimControllers(store, **kwargs)` on the running loop; `await .stop()` to end."""
    return await SimControllers(store, **kwargs).start()
