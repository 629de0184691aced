"""The simulated cluster in one process: moto (EC2), the Kubernetes API emulator, the controllers
that play kubelets / scheduler / workload controllers, and the invariant checker.

    with SimStack(time_scale=0.01, scenario="sim/scenarios/demo.yaml") as sim:
        sim.kube_url            # http://127.0.0.1:<port>  (plain HTTP, no auth; secure=True: https,
                                # bearer tokens and RBAC, sim/apiserver/security.py)
        sim.kubeconfig_path     # for kubectl and kubernetes.config.load_kube_config
        sim.ec2_endpoint        # http://127.0.0.1:<port>  (moto; AWS_ENDPOINT_URL)
        sim.ec2_client()        # boto3 EC2 client for moto
        sim.store               # sim.apiserver.Store, the objects themselves (no HTTP)
        sim.check_invariants()  # sim.invariants.InvariantReport (polls EC2 first); sim.invariants
                                # is the checker itself (set_in_flight_source, bounds, reset)
        sim.faults              # sim.ec2_faults.Ec2Faults (ICE, throttling, never-ready)
        sim.api_faults          # sim.apiserver.faults.Faults (Kubernetes API errors, latency)

The emulator starts with karpflow's CRDs (deploy/crds: MaintenanceWindow, NodeDisruptionBudget)
installed, as in a cluster where deploy/ was applied; emptying or reloading the cluster keeps them.

Everything runs on one background thread with its own asyncio loop (`sim.loop`), so a test can
use the stack from synchronous code or from its own event loop alike. `python -m sim` runs the
same stack as the dev stack's simulator process, on fixed ports.

moto keeps its backends in module globals, so there is one EC2 per process, shared by every
stack of the process (and by other tests' moto servers): stacks keep apart by cluster name, since
every instance carries the ownership tag. EC2 faults are process-wide too, so a process runs one
SimStack at a time (a second `start()` while one runs is an error). With `moto_port=0` (tests)
the moto server is started once per process: after moto's one-time load (~2 s), an empty stack
starts in ~0.1 s and one seeded with the 3-node `small.yaml` in ~0.3-0.8 s (most of it EC2 calls
to seed; measured on 2 busy cores).

HTTP endpoints added to the emulator under `/sim/` (the emulator's own are listed in
`sim/apiserver/server.py`):
    GET    /sim/status              ready, endpoints, scenario, controller counters
    GET    /sim/invariants          the invariant report (?in_flight=node1,node2)
    POST   /sim/invariants/reset    forget what was recorded so far
    GET    /sim/ec2/faults          injected EC2 faults and counters; PUT replaces them, DELETE clears
    POST   /sim/scenario            body: a scenario (YAML or JSON); empties the cluster (objects, and
                                    terminates its instances), then seeds it
    DELETE /sim/scenario            empties the cluster
    POST   /sim/reset               the emulator's reset, done as DELETE /sim/scenario (instances
                                    terminated, controllers and checker restarted) plus clearing
                                    the API faults and request log
    POST   /sim/state               refused (400): a bare store load would leave the controllers,
                                    EC2 and the checker behind; load a cluster with /sim/scenario
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import boto3
import orjson
import yaml
from aiohttp import web

from api import constants as k
from sim import ec2_faults, ec2_reservations, ec2_validation
from sim.apiserver import crds
from sim.apiserver.errors import ApiError, BadRequest
from sim.apiserver.faults import Faults, RequestLog
from sim.apiserver.kubeconfig import write_kubeconfig
from sim.apiserver.security import Tls, Tokens
from sim.apiserver.server import ApiServer, parse_path
from sim.apiserver.store import Store
from sim.controllers.bootstrap import SIM_CA_BUNDLE, SIM_SERVICE_CIDR
from sim.invariants import InvariantBounds, InvariantChecker
from sim.scenario import Scenario, SeedReport, load_scenario, parse_scenario, seed
from sim.tasks import cancel_and_wait
from sim.timescale import TimeScale

log = logging.getLogger(__name__)
T = TypeVar("T")

INVARIANT_KINDS = frozenset(
    {
        "Pod",
        "Node",
        "PodDisruptionBudget",
        "ReplicaSet",
        "StatefulSet",
        "Deployment",
        "MaintenanceWindow",
        "NodeDisruptionBudget",
        "NodeClaim",
    }
)
# karpflow's own CRDs: the simulated cluster is one where deploy/ was applied, so the worker's cache,
# `kubectl get crd` and scenarios find MaintenanceWindows and NodeDisruptionBudgets.
KARPFLOW_CRDS = Path(__file__).resolve().parents[1] / "deploy" / "crds"
MOTO_ACCOUNT_KEYS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


class SimStackError(RuntimeError):
    pass


# ----------------------------------------------------------------------------------------------
# moto, once per process


class _Moto:
    """The process's moto server, started on first use and shared by the stacks of the process.

    It is never reset: moto's state is per process, and other tests in the same process may be
    using it. Stacks keep apart by cluster name (instances are told apart by the ownership tag).
    """

    _lock = threading.Lock()
    server: Any = None
    extra: list[Any] = []  # servers on explicitly requested ports beside the shared one
    port: int = 0
    host: str = ""

    @classmethod
    def ensure(cls, host: str, port: int) -> int:
        with cls._lock:
            if cls.server is not None and port in (0, cls.port) and host == cls.host:
                return cls.port
            if cls.server is not None and port == 0:
                return cls.port
            logging.getLogger("werkzeug").setLevel(logging.ERROR)
            from moto.server import ThreadedMotoServer

            ec2_validation.install()  # EC2's launch parameter checks moto lacks
            ec2_reservations.install()  # capacity reservations, which moto lacks

            server = ThreadedMotoServer(ip_address=host, port=port, verbose=False)
            server.start()
            _, bound = server.get_host_and_port()
            if cls.server is None:
                cls.server, cls.host, cls.port = server, host, bound
            else:
                cls.extra.append(server)
            return bound

    @classmethod
    def shutdown(cls) -> None:
        with cls._lock:
            for server in [cls.server, *cls.extra]:
                if server is not None:
                    server.stop()
            cls.server, cls.extra, cls.port = None, [], 0


def shutdown_moto() -> None:
    """Stop the process's moto servers (the simulator process does this on exit; its threads would
    otherwise keep the interpreter alive)."""
    _Moto.shutdown()


def ec2_client(endpoint: str, region: str) -> Any:
    return boto3.client("ec2", endpoint_url=endpoint, region_name=region, **MOTO_ACCOUNT_KEYS)


# ----------------------------------------------------------------------------------------------
# The stack


class SimStack:
    """See the module docstring. `controllers`: None = all, False/() = none, or names from
    `sim.controllers.runner.CONTROLLERS` ("nodes", "noexecute", "tainteviction", "scheduler",
    "kubelet", "podgc", "replicasets", "deployments", "daemonsets", "pdb")."""

    _active: SimStack | None = None
    _active_lock = threading.Lock()

    def __init__(
        self,
        *,
        time_scale: float = 1.0,
        cluster_name: str = "karpflow-sim",
        region: str = "us-west-2",
        scenario: str | Path | Scenario | None = None,
        controllers: Iterable[str] | bool | None = None,
        host: str = "127.0.0.1",
        kube_port: int = 0,
        moto_port: int = 0,
        kubeconfig_path: str | Path | None = None,
        invariant_bounds: InvariantBounds | None = None,
        node_timings: Any = None,
        pod_start_seconds: float = 2.0,
        secure: bool = False,
        tls_dir: Path | None = None,
        karpenter: bool = False,
        karpenter_timings: Any = None,
    ) -> None:
        """`secure`: the emulator serves HTTPS and authenticates and authorizes every request
        (sim/apiserver/security.py); the kubeconfig then carries the CA and the admin's token. The CA
        is written to `tls_dir/ca.crt` (a temporary directory when not given).

        `karpenter`: a simulated Karpenter runs beside karpflow (sim/controllers/karpenter/), and the
        scenario's nodes of a NodePool get the NodeClaims Karpenter would have made for them;
        `karpenter_timings` (a `KarpenterTimings`) changes its delays."""
        self.karpenter = karpenter
        self.karpenter_timings = karpenter_timings
        self.scale = TimeScale(time_scale)
        self.cluster_name = cluster_name
        self.region = region
        self.scenario = load_scenario(scenario) if isinstance(scenario, (str, Path)) else scenario
        if controllers is True or controllers is None:
            self.enabled: frozenset[str] | None = None
        elif controllers is False:
            self.enabled = frozenset()
        else:
            self.enabled = frozenset(controllers)
        self.host = host
        self._kube_port = kube_port
        self._moto_port = moto_port
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._kubeconfig = Path(kubeconfig_path) if kubeconfig_path else None
        self.node_timings = node_timings
        self.pod_start_seconds = pod_start_seconds

        self.store = Store(self.scale)
        self.faults = ec2_faults.Ec2Faults()
        self.api_faults = Faults()
        self.requests = RequestLog()
        self.tls: Tls | None = None
        if secure and tls_dir is not None:
            self.tls = Tls(Path(tls_dir))
        elif secure:
            self._tls_dir = tempfile.TemporaryDirectory(prefix="karpflow-sim-tls-")
            self.tls = Tls(Path(self._tls_dir.name))
        self.api = ApiServer(
            self.store,
            faults=self.api_faults,
            request_log=self.requests,
            tokens=Tokens() if secure else None,
        )
        self.invariants = InvariantChecker(cluster_name, scale=self.scale, bounds=invariant_bounds)
        self.controllers: Any = None
        self.seed_report: SeedReport | None = None
        self.ready = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._remove_listener: Callable[[], None] | None = None
        self._ec2: Any = None
        self.kube_port = 0
        self.moto_port = 0
        self.started_at = 0.0

    # -- endpoints -----------------------------------------------------------------------------

    @property
    def kube_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.kube_port}"

    @property
    def admin_token(self) -> str:
        """The bearer token of `kubernetes-admin` (any string when the stack is not secure)."""
        return self.api.tokens.admin_token if self.api.tokens is not None else "emulator"

    @property
    def ca_file(self) -> Path | None:
        """The CA that signed the emulator's certificate (secure stacks only)."""
        return self.tls.ca_file if self.tls is not None else None

    @property
    def service_cidr(self) -> str:
        return SIM_SERVICE_CIDR

    @property
    def ca_bundle(self) -> str:
        """What new nodes' user data must carry as the cluster CA (base64 PEM, as DescribeCluster
        gives it): the real CA of a secure stack, else any non-empty bundle."""
        return base64.b64encode(self.tls.ca_pem).decode() if self.tls is not None else SIM_CA_BUNDLE

    def service_account_token(self, namespace: str, name: str, seconds: int = 3600) -> str:
        """What the TokenRequest API gives for the ServiceAccount (it must exist)."""
        self.store.get("serviceaccounts", name, namespace)
        return self.api.issuer.issue(namespace, name, seconds)[0]

    @property
    def ec2_endpoint(self) -> str:
        return f"http://{self.host}:{self.moto_port}"

    @property
    def kubeconfig_path(self) -> Path:
        assert self._kubeconfig is not None, "the stack is not started"
        return self._kubeconfig

    def ec2_client(self) -> Any:
        """A new boto3 EC2 client for this stack's moto (what karpflow's activities would use)."""
        return ec2_client(self.ec2_endpoint, self.region)

    def api_client(self) -> Any:
        """A sync `kubernetes.client.ApiClient` for the emulator (the kubeconfig serves kubernetes.aio)."""
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.kube_url
        configuration.api_key = {"authorization": f"Bearer {self.admin_token}"}
        if self.ca_file is not None:
            configuration.ssl_ca_cert = str(self.ca_file)
        return client.ApiClient(configuration)

    def client_env(self) -> dict[str, str]:
        """Environment for a client process (worker, kubectl, aws CLI) pointed at this stack."""
        return {
            "KUBECONFIG": str(self.kubeconfig_path),
            "AWS_ENDPOINT_URL": self.ec2_endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "KARPFLOW_CLUSTER_NAME": self.cluster_name,
            # What a launched node's bootstrap must name for the simulator to register it.
            "KARPFLOW_CLUSTER_ENDPOINT": self.kube_url,
            "KARPFLOW_CLUSTER_CA_BUNDLE": self.ca_bundle,
            "KARPFLOW_SERVICE_CIDR": self.service_cidr,
        }

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> SimStack:
        with SimStack._active_lock:
            if SimStack._active is not None:
                raise SimStackError(
                    "a SimStack is already running in this process (moto's state is per process); "
                    "stop it first"
                )
            SimStack._active = self
        try:
            self.started_at = time.monotonic()
            self.moto_port = _Moto.ensure(self.host, self._moto_port)
            # Seeding is the simulator's own doing: never throttled by injected faults.
            self._ec2 = ec2_faults.mark_sim_client(ec2_client(self.ec2_endpoint, self.region))
            ec2_faults.install(self.faults)
            self.loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._run_loop, name="sim-stack", daemon=True)
            self._thread.start()
            self.call(self._astart(), timeout=timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 10.0) -> None:
        loop, thread = self.loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._astop(), loop).result(timeout)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout)
        if loop is not None and not loop.is_running():
            loop.close()
        self.loop = self._thread = None
        self.ready = False
        self.faults.clear()
        if ec2_faults.active() is self.faults:
            ec2_faults.uninstall()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        with SimStack._active_lock:
            if SimStack._active is self:
                SimStack._active = None

    def __enter__(self) -> SimStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> SimStack:
        """From async code: start without blocking the caller's loop."""
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)

    def call(self, coro: Awaitable[T], timeout: float | None = 30.0) -> T:
        """Run a coroutine on the stack's loop from another thread and wait for it."""
        assert self.loop is not None, "the stack is not started"
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def _run_loop(self) -> None:
        assert self.loop is not None
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    async def _astart(self) -> None:
        loop = asyncio.get_running_loop()
        self.store.attach_loop(loop)
        self._remove_listener = self.store.add_listener(self._on_change)
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[self._middleware])
        app.router.add_route("*", "/{tail:.*}", self.api.handle)
        # Watches are long-lived: shutdown must not wait a minute for them.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            self.host,
            self._kube_port,
            reuse_address=True,
            ssl_context=self.tls.server_context() if self.tls is not None else None,
        )
        await site.start()
        self.kube_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.api.server_address = f"{self.host}:{self.kube_port}"
        if self._kubeconfig is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="karpflow-sim-")
            self._kubeconfig = Path(self._tmp.name) / "kubeconfig"
        write_kubeconfig(
            self._kubeconfig,
            self.kube_url,
            name=self.cluster_name,
            token=self.admin_token,
            ca_pem=self.tls.ca_pem if self.tls is not None else None,
        )
        self._install_crds()
        if self.scenario is not None:
            self.seed_report = await asyncio.to_thread(self._seed, self.scenario)
        await self._start_controllers()
        self._tasks.append(asyncio.create_task(self._watch_instances(), name="sim-invariant-poller"))
        self.ready = True
        log.info(
            "simulated cluster ready in %.2fs: Kubernetes %s, EC2 %s",
            time.monotonic() - self.started_at,
            self.kube_url,
            self.ec2_endpoint,
        )

    async def _start_controllers(self) -> None:
        if self.enabled is not None and not self.enabled:
            return
        from sim.controllers.karpenter import ClusterBootstrap
        from sim.controllers.runner import CONTROLLERS, KarpenterSettings, SimControllers

        kwargs: dict[str, Any] = {}
        if self.node_timings is not None:
            kwargs["node_timings"] = self.node_timings
        enabled = self.enabled
        if self.karpenter:
            enabled = (enabled if enabled is not None else frozenset(CONTROLLERS)) | {"karpenter"}
            kwargs["karpenter"] = KarpenterSettings(
                bootstrap=ClusterBootstrap(
                    self.cluster_name, self.kube_url, self.ca_bundle, self.service_cidr
                ),
                api_endpoint=self.kube_url,
                api_token=self.admin_token,
                ec2_endpoint=self.ec2_endpoint,
                reporter=self.invariants.record,
                timings=self.karpenter_timings,
            )
        self.controllers = SimControllers(
            self.store,
            ec2_endpoint=self.ec2_endpoint,
            cluster_name=self.cluster_name,
            region=self.region,
            timescale=self.scale,
            enabled=enabled,
            faults=self.faults,
            pod_start_seconds=self.pod_start_seconds,
            api_endpoint=self.kube_url,
            api_ca_pem=self.tls.ca_pem if self.tls is not None else None,
            **kwargs,
        )
        await self.controllers.start()

    async def _astop(self) -> None:
        self.ready = False
        tasks, self._tasks = self._tasks, []
        await cancel_and_wait(tasks)
        if self.controllers is not None:
            await self.controllers.stop()
            self.controllers = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._remove_listener is not None:
            self._remove_listener()
            self._remove_listener = None
        # Let EC2 calls still running in worker threads finish while moto is up; a thread left
        # behind would keep the interpreter from exiting until its call times out.
        await asyncio.get_running_loop().shutdown_default_executor()

    # -- scenario ------------------------------------------------------------------------------

    def _install_crds(self) -> None:
        for path in sorted(KARPFLOW_CRDS.glob("*.karpflow.dev.yaml")):
            self.store.create(crds.CRDS, yaml.safe_load(path.read_text()))
        crds.sync(self.store)

    def _seed(self, scenario: Scenario) -> SeedReport:
        report = seed(scenario, self.store, self._ec2, cluster_name=self.cluster_name)
        for warning in report.warnings:
            log.warning("scenario %s: %s", scenario.source, warning)
        if self.karpenter:
            from sim.controllers.karpenter.seed import seed_nodeclaims

            claims = seed_nodeclaims(self.store, self._ec2, self.cluster_name)
            report.created["NodeClaim"] = report.created.get("NodeClaim", 0) + len(claims)
        return report

    async def _reload(self, scenario: Scenario | None) -> SeedReport | None:
        """Empty the cluster and EC2 (and what the checker recorded), then seed `scenario`."""
        if self.controllers is not None:
            await self.controllers.stop()
            self.controllers = None
        await asyncio.to_thread(self._terminate_instances)
        self.store.reset()
        self._install_crds()
        self.invariants.reset()
        self.faults.clear()
        self.scenario = scenario
        self.seed_report = await asyncio.to_thread(self._seed, scenario) if scenario is not None else None
        await self._start_controllers()
        return self.seed_report

    def _terminate_instances(self) -> None:
        """Terminate every instance this cluster owns (moto is shared: no reset)."""
        filters = [
            {"Name": f"tag:kubernetes.io/cluster/{self.cluster_name}", "Values": ["owned"]},
            {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]},
        ]
        ids = [
            i["InstanceId"]
            for page in self._sim_ec2.get_paginator("describe_instances").paginate(Filters=filters)
            for r in page.get("Reservations", ())
            for i in r.get("Instances", ())
        ]
        for start in range(0, len(ids), 500):
            self._sim_ec2.terminate_instances(InstanceIds=ids[start : start + 500])

    def load_scenario(self, scenario: str | Path | Scenario | None) -> SeedReport | None:
        """Replace the cluster with `scenario` (None: an empty cluster). Clients must re-list."""
        parsed = load_scenario(scenario) if isinstance(scenario, (str, Path)) else scenario
        return self.call(self._reload(parsed), timeout=120)

    # -- invariants ----------------------------------------------------------------------------

    def _on_change(self, event: Any) -> None:
        # Runs inside every store write: only parse what the checker mirrors.
        if event.resource.kind in INVARIANT_KINDS:
            self.invariants.observe(event.type, event.object)

    def poll_instances(self) -> None:
        """Feed the checker the cluster's instances, in DescribeInstances' shape (blocking).

        Read from moto's in-process backend, not through its API: the checker polls every 5
        simulated seconds (20 times a second at time scale 1/100), and moto's XML serialisation of
        every instance it ever ran (terminated ones stay listed) took a third of the CPU of the
        larger tests. Injected EC2 faults never reach the checker either way.
        """
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.ec2.models import ec2_backends

        backend = ec2_backends[DEFAULT_ACCOUNT_ID][self.region]
        tag = k.cluster_tag(self.cluster_name)
        instances: list[dict[str, Any]] = []
        for reservation in list(backend.reservations.values()):
            for instance in list(reservation.instances):
                tags = dict(backend.tags.get(instance.id) or {})
                if tags.get(tag) != k.CLUSTER_TAG_VALUE:
                    continue
                instances.append(
                    {
                        "InstanceId": instance.id,
                        "InstanceType": instance.instance_type,
                        "State": {"Name": instance.state},
                        "Tags": [{"Key": key, "Value": value} for key, value in tags.items()],
                    }
                )
        self.invariants.observe_instances(instances)

    @property
    def _sim_ec2(self) -> Any:
        # The simulator's own client: marked so injected throttling never hits its clean-up.
        if not hasattr(self, "_sim_ec2_client"):
            self._sim_ec2_client = ec2_faults.mark_sim_client(ec2_client(self.ec2_endpoint, self.region))
        return self._sim_ec2_client

    async def _watch_instances(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.poll_instances)
                self.invariants.tick()
            except Exception as err:  # moto resetting under us: try again next period
                log.debug("invariant poll failed: %s", err)
            await asyncio.sleep(max(0.05, min(1.0, self.scale.seconds(5.0))))

    def check_invariants(self, in_flight: Iterable[str] | None = None, *, end_of_window: bool = False) -> Any:
        """Poll EC2 once more, then return the report (`sim.invariants.InvariantReport`);
        `end_of_window=True`: nothing is in flight any more, so disrupted taints are judged."""
        self.poll_instances()
        return self.invariants.check(in_flight, end_of_window=end_of_window)

    # -- HTTP ----------------------------------------------------------------------------------

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[Any]]
    ) -> Any:
        path = request.path
        if path.startswith("/sim/"):
            try:
                response = await self._sim_endpoint(request)
            except ApiError as err:
                return web.json_response(err.status(), status=err.code)
            if response is not None:
                return response
            return await handler(request)
        cause = None
        if request.method in ("DELETE", "POST"):
            target = parse_path(path)
            if target is not None and target.rt.kind == "Pod" and target.name:
                if request.method == "DELETE" and target.subresource is None:
                    cause = "delete"
                elif request.method == "POST" and target.subresource == "eviction":
                    cause = "eviction"
        if cause is None:
            return await handler(request)
        token = self.invariants.announce(target.namespace or "default", target.name, cause)  # type: ignore[union-attr]
        try:
            return await handler(request)
        finally:
            self.invariants.withdraw(token)

    async def _sim_endpoint(self, request: web.Request) -> web.StreamResponse | None:
        """Our `/sim/...` endpoints; None lets the emulator answer."""
        path, method = request.path.rstrip("/"), request.method
        if path == "/sim/status" and method == "GET":
            return web.json_response(self.status())
        if path == "/sim/invariants" and method == "GET":
            in_flight = request.query.get("in_flight")
            names = [n for n in in_flight.split(",") if n] if in_flight is not None else None
            report = await asyncio.to_thread(self.check_invariants, names)
            return web.json_response(text=report.model_dump_json())
        if path == "/sim/invariants/reset" and method == "POST":
            self.invariants.reset()
            return web.json_response({"reset": True})
        if path == "/sim/ec2/faults":
            if method in ("PUT", "POST"):
                try:
                    self.faults.replace(orjson.loads(await request.read() or b"{}"))
                except ValueError as err:
                    raise BadRequest(f"invalid EC2 fault spec: {err}") from None
                if self.controllers is not None:
                    self.controllers.poll_ec2_now()
            elif method == "DELETE":
                self.faults.clear()
            elif method != "GET":
                return None
            return web.json_response(self.faults_status())
        if path == "/sim/reset" and method == "POST":
            await self._reload(None)
            self.api_faults.clear()
            self.requests.clear()
            self.api.stats.clear()
            return web.json_response({"resourceVersion": self.store.resource_version})
        if path == "/sim/state" and method in ("POST", "PUT"):
            raise BadRequest(
                "the simulator stack does not load a bare store dump: its controllers, EC2 instances "
                "and invariant checker would not follow. POST the cluster to /sim/scenario instead "
                "(a scenario, or the List `karpflow sim dump` writes; `karpflow sim load` does it)"
            )
        if path == "/sim/scenario":
            if method == "POST":
                text = (await request.read()).decode()
                try:
                    scenario = parse_scenario(text, "request body")
                    report = await self._reload(scenario)
                except ValueError as err:
                    raise BadRequest(str(err)) from None
                return web.json_response(_report_json(report))
            if method == "DELETE":
                await self._reload(None)
                return web.json_response({"created": {}, "instances": {}, "warnings": []})
        return None

    def faults_status(self) -> dict[str, Any]:
        return {
            "spec": self.faults.spec().model_dump(mode="json"),
            "counters": {
                "insufficient_capacity": self.faults.counters.insufficient_capacity,
                "throttled": self.faults.counters.throttled,
            },
        }

    def status(self) -> dict[str, Any]:
        return {
            "ready": self.ready,
            "cluster_name": self.cluster_name,
            "region": self.region,
            "kube_url": self.kube_url,
            "ec2_endpoint": self.ec2_endpoint,
            "time_scale": self.scale.factor,
            "karpenter": self.karpenter,
            "scenario": None
            if self.scenario is None
            else {"source": self.scenario.source, **_report_json(self.seed_report)},
            "controllers": self.controllers.status() if self.controllers is not None else None,
            "invariants": dict(self.invariants.counts),
        }


def _report_json(report: SeedReport | None) -> dict[str, Any]:
    if report is None:
        return {"created": {}, "instances": {}, "warnings": []}
    return {"created": report.created, "instances": report.instances, "warnings": report.warnings}
