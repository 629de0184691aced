"""The karpflow worker: one process that runs every workflow and activity on one task queue.

    karpflow worker --cluster-name prod --temporal-address temporal.example:7233 \\
        --kubeconfig ~/.kube/config --aws-region us-west-2

Every flag has an environment variable (`KARPFLOW_<FLAG>`, e.g. KARPFLOW_CLUSTER_NAME); flags win.
Settings are validated before anything connects, and a bad one stops the worker with a message
naming the flag and the variable. What the process does:

- connects to Temporal (plain, TLS with a client certificate, or an API key as on Temporal
  Cloud) with the pydantic data converter, and OpenTelemetry tracing when an exporter is chosen;
- registers the search attributes the workflows upsert (skipped where the operator API is not
  available, e.g. Temporal Cloud: register them there once);
- talks to Kubernetes through a kubeconfig, in-cluster configuration or a plain API server URL,
  and to EC2 through the standard AWS credential chain, with an endpoint override for moto;
- watches for deleted nodes carrying karpflow's finalizer and starts their termination;
- serves /healthz (liveness) and /readyz (readiness) for Kubernetes probes;
- on SIGTERM stops polling, lets running activities finish (up to --graceful-shutdown seconds),
  and exits; a long drain that does not finish is resumed by another worker from its heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import click
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from temporalio import activity, workflow
from temporalio.client import Client, Interceptor
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import TLSConfig
from temporalio.worker import PollerBehaviorAutoscaling, Worker

from activities.ec2 import EC2Activities
from activities.kube_api import KubeApi
from activities.kubernetes import KubernetesActivities
from activities.node_deletions import NodeDeletionWatcher
from api import search_attributes
from workflows.disruption import DisruptionWorkflow
from workflows.termination import TerminationWorkflow

log = logging.getLogger("karpflow.worker")

WORKFLOWS: tuple[type, ...] = (DisruptionWorkflow, TerminationWorkflow)


class WorkerSettings(BaseSettings):
    """Everything the worker can be told, from flags or `KARPFLOW_*` environment variables."""

    model_config = SettingsConfigDict(env_prefix="KARPFLOW_", extra="forbid", validate_default=True)

    cluster_name: str = Field(
        description="the EKS cluster; instances are launched with and terminated only with its ownership tag"
    )
    # Temporal
    temporal_address: str = "localhost:7233"
    temporal_namespace: str = "default"
    task_queue: str = "karpflow"
    temporal_tls: bool = Field(default=False, description="TLS without a client certificate")
    temporal_tls_cert: Path | None = Field(default=None, description="client certificate (PEM)")
    temporal_tls_key: Path | None = Field(default=None, description="client private key (PEM)")
    temporal_tls_ca: Path | None = Field(default=None, description="server CA (PEM); default: system roots")
    temporal_tls_server_name: str | None = None
    temporal_api_key: SecretStr | None = Field(
        default=None, description="API key (Temporal Cloud); implies TLS"
    )
    register_search_attributes: bool = True
    # Kubernetes
    kubeconfig: Path | None = Field(default=None, description="default: in-cluster, else ~/.kube/config")
    kube_context: str | None = None
    kube_api_server: str | None = Field(
        default=None, description="plain URL without auth (the local emulator)"
    )
    kube_request_timeout: float = Field(default=30.0, gt=0)
    # AWS
    aws_region: str | None = Field(default=None, description="default: the AWS SDK's (AWS_REGION, profile)")
    aws_endpoint_url: str | None = Field(default=None, description="EC2 endpoint override, e.g. moto")
    ec2_threads: int = Field(default=32, ge=1, description="concurrent EC2 calls (boto3 is synchronous)")
    # Behaviour
    max_concurrent_activities: int = Field(default=200, ge=1)
    max_concurrent_workflow_tasks: int = Field(default=100, ge=1)
    poll_interval: float = Field(
        default=1.0, gt=0, description="seconds between looks at a node being awaited"
    )
    ec2_poll_interval: float = Field(
        default=5.0, gt=0, description="seconds between looks at a terminating instance"
    )
    unavailable_offering_ttl: float = Field(default=180.0, ge=0)
    graceful_shutdown: float = Field(
        default=30.0, ge=0, description="seconds running activities get on SIGTERM"
    )
    sticky_queue_timeout: float = Field(
        default=10.0, gt=0, description="seconds before a dead worker's cached workflows move to another"
    )
    node_watcher: bool = Field(default=True, description="start terminations for nodes deleted by hand")
    node_watcher_resync: float = Field(default=300.0, gt=0)
    # Operations
    health: bool = Field(default=True, description="serve /healthz (liveness) and /readyz (readiness)")
    health_port: int = Field(default=8080, ge=0, le=65535, description="0: any free port")
    health_host: str = "0.0.0.0"
    otel_exporter: Literal["none", "console", "otlp"] = "none"
    otel_endpoint: str | None = None
    log_format: Literal["json", "text"] = "json"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @field_validator("cluster_name")
    @classmethod
    def _cluster_name(cls, value: str) -> str:
        value = value.strip()
        if not value or any(c.isspace() for c in value):
            raise ValueError("must be a non-empty name without spaces")
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("temporal_tls_cert", "temporal_tls_key", "temporal_tls_ca", "kubeconfig")
    @classmethod
    def _readable(cls, value: Path | None) -> Path | None:
        if value is not None and not value.expanduser().is_file():
            raise ValueError(f"file {value} does not exist")
        return value.expanduser() if value is not None else None

    @model_validator(mode="after")
    def _consistent(self) -> WorkerSettings:
        if (self.temporal_tls_cert is None) != (self.temporal_tls_key is None):
            raise ValueError("temporal_tls_cert and temporal_tls_key must be given together")
        if self.kube_api_server and (self.kubeconfig or self.kube_context):
            raise ValueError("give kube_api_server or kubeconfig/kube_context, not both")
        if self.otel_exporter == "otlp" and not self.otel_endpoint:
            raise ValueError("otel_exporter otlp needs otel_endpoint")
        return self

    @property
    def uses_tls(self) -> bool:
        return bool(
            self.temporal_tls
            or self.temporal_tls_cert
            or self.temporal_tls_ca
            or self.temporal_tls_server_name
            or self.temporal_api_key
        )


def explain(err: ValidationError) -> str:
    """One line per bad setting, naming the flag and the environment variable."""
    lines = ["invalid worker settings:"]
    for problem in err.errors(include_url=False):
        field = str(problem["loc"][0]) if problem["loc"] else ""
        where = f"--{field.replace('_', '-')} / KARPFLOW_{field.upper()}" if field else "settings"
        lines.append(f"  {where}: {problem['msg']}")
    return "\n".join(lines)


# -- logging -----------------------------------------------------------------------------------------


class TemporalContextFilter(logging.Filter):
    """Adds the workflow / activity ids to every record logged inside an activity (any logger), and
    flattens what `workflow.logger` attaches, so every line says which workflow it is about."""

    def filter(self, record: logging.LogRecord) -> bool:
        context: dict[str, Any] = {}
        if activity.in_activity():
            info = activity.info()
            context = {
                "workflow_id": info.workflow_id,
                "run_id": info.workflow_run_id,
                "workflow_type": info.workflow_type,
                "activity_id": info.activity_id,
                "activity_type": info.activity_type,
                "attempt": info.attempt,
            }
        elif isinstance(getattr(record, "temporal_workflow", None), dict):
            wf = record.temporal_workflow  # type: ignore[attr-defined]
            context = {
                "workflow_id": wf.get("workflow_id"),
                "run_id": wf.get("run_id"),
                "workflow_type": wf.get("workflow_type"),
            }
        record.karpflow = {k: v for k, v in context.items() if v is not None}  # type: ignore[attr-defined]
        # Text lines: workflow.logger / activity.logger already appended their context to the message.
        sdk_context = hasattr(record, "temporal_workflow") or hasattr(record, "temporal_activity")
        record.karpflow_text = "" if sdk_context or not record.karpflow else f" {record.karpflow}"  # type: ignore[attr-defined]
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **getattr(record, "karpflow", {}),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(settings: WorkerSettings) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(TemporalContextFilter())
    if settings.log_format == "json":
        formatter: logging.Formatter = JsonFormatter()
        formatter.converter = time.gmtime
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s%(karpflow_text)s")
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level)
    for noisy in ("botocore", "urllib3", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # workflow.logger appends its context to the message; the JSON lines carry it as fields instead.
    workflow.logger.workflow_info_on_message = settings.log_format == "text"
    activity.logger.activity_info_on_message = settings.log_format == "text"


# -- tracing -------------------------------------------------------------------------------------------


def tracing_interceptors(settings: WorkerSettings) -> list[Interceptor]:
    """Temporal's OpenTelemetry interceptor with the chosen exporter; none by default."""
    if settings.otel_exporter == "none":
        return []
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
    from temporalio.contrib.opentelemetry import TracingInterceptor

    exporter: SpanExporter
    if settings.otel_exporter == "console":
        exporter = ConsoleSpanExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=settings.otel_endpoint)
    provider = TracerProvider(resource=Resource.create({"service.name": "karpflow-worker"}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return [TracingInterceptor()]


# -- connections ---------------------------------------------------------------------------------------


async def connect_temporal(settings: WorkerSettings, interceptors: Sequence[Interceptor] = ()) -> Client:
    tls: bool | TLSConfig = False
    if settings.uses_tls:
        tls = TLSConfig(
            server_root_ca_cert=settings.temporal_tls_ca.read_bytes() if settings.temporal_tls_ca else None,
            domain=settings.temporal_tls_server_name,
            client_cert=settings.temporal_tls_cert.read_bytes() if settings.temporal_tls_cert else None,
            client_private_key=settings.temporal_tls_key.read_bytes() if settings.temporal_tls_key else None,
        )
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        api_key=settings.temporal_api_key.get_secret_value() if settings.temporal_api_key else None,
        tls=tls,
        data_converter=pydantic_data_converter,
        interceptors=list(interceptors),
    )


def with_karpflow_converter(client: Client) -> Client:
    """A client on `client`'s connection that speaks karpflow's payloads (pydantic models), e.g. for
    a `WorkflowEnvironment`'s client, which comes with the default converter."""
    config = client.config()
    config["data_converter"] = pydantic_data_converter
    return Client(**config)


async def ensure_search_attributes(client: Client) -> bool:
    """Register karpflow's search attributes (idempotent). False when the operator API refuses
    (Temporal Cloud, missing permission): they must then be registered by an administrator."""
    from temporalio.api.enums.v1 import IndexedValueType
    from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
    from temporalio.service import RPCError, RPCStatusCode

    try:
        try:
            listing = await client.operator_service.list_search_attributes(
                ListSearchAttributesRequest(namespace=client.namespace)
            )
            existing = set(listing.custom_attributes)
        except RPCError as err:
            if err.status != RPCStatusCode.UNIMPLEMENTED:  # the time-skipping test server cannot list
                raise
            existing = set()
        missing = {
            key.name: IndexedValueType.ValueType(key.indexed_value_type)
            for key in search_attributes.ALL
            if key.name not in existing
        }
        if missing:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(namespace=client.namespace, search_attributes=missing)
            )
        return True
    except RPCError as err:
        log.warning(
            "could not register search attributes %s (%s); register them once, e.g. with "
            "`temporal operator search-attribute create`",
            ", ".join(k.name for k in search_attributes.ALL),
            err.message,
        )
        return False


async def connect_kubernetes(settings: WorkerSettings) -> KubeApi:
    if settings.kube_api_server:
        return KubeApi.for_host(settings.kube_api_server, settings.kube_request_timeout)
    return await KubeApi.connect(
        str(settings.kubeconfig) if settings.kubeconfig else None,
        settings.kube_context,
        settings.kube_request_timeout,
    )


def ec2_client(settings: WorkerSettings) -> Any:
    import boto3
    from botocore.config import Config

    # botocore's own retries ride out throttling inside one activity attempt before Temporal's.
    config = Config(
        retries={"mode": "adaptive", "max_attempts": 5}, max_pool_connections=max(10, settings.ec2_threads)
    )
    return boto3.client(
        "ec2", region_name=settings.aws_region, endpoint_url=settings.aws_endpoint_url, config=config
    )


def activities_for(kube: KubeApi, ec2: Any, settings: WorkerSettings) -> list[Any]:
    """Every activity, bound to its clients."""
    kubernetes = KubernetesActivities(kube, poll_interval=settings.poll_interval)
    aws = EC2Activities(
        ec2,
        settings.cluster_name,
        unavailable_ttl_seconds=settings.unavailable_offering_ttl,
        poll_interval=settings.ec2_poll_interval,
        threads=settings.ec2_threads,
    )
    return [
        method
        for holder in (kubernetes, aws)
        for name in dir(type(holder))
        if not name.startswith("_")
        and (method := getattr(holder, name))
        and callable(method)
        and hasattr(method, "__temporal_activity_definition")
    ]


# -- the process ---------------------------------------------------------------------------------------


class KarpflowWorker:
    """The worker with its watcher and health endpoint; an async context manager, so tests run the
    very same assembly in process (optionally with clients they already hold)."""

    def __init__(
        self,
        settings: WorkerSettings,
        *,
        client: Client | None = None,
        kube: KubeApi | None = None,
        ec2: Any = None,
    ) -> None:
        self.settings = settings
        self.client = client
        self.kube = kube
        self.ec2 = ec2
        self._owns_kube = kube is None
        self.worker: Worker | None = None
        self.watcher: NodeDeletionWatcher | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._health: Any = None
        self.health_port: int | None = None

    async def __aenter__(self) -> KarpflowWorker:
        settings = self.settings
        if self.client is None:
            self.client = await connect_temporal(settings, tracing_interceptors(settings))
        if settings.register_search_attributes:
            await ensure_search_attributes(self.client)
        if self.kube is None:
            self.kube = await connect_kubernetes(settings)
        if self.ec2 is None:
            self.ec2 = ec2_client(settings)
        self.worker = Worker(
            self.client,
            task_queue=settings.task_queue,
            workflows=list(WORKFLOWS),
            activities=activities_for(self.kube, self.ec2, settings),
            max_concurrent_activities=settings.max_concurrent_activities,
            max_concurrent_workflow_tasks=settings.max_concurrent_workflow_tasks,
            graceful_shutdown_timeout=timedelta(seconds=settings.graceful_shutdown),
            sticky_queue_schedule_to_start_timeout=timedelta(seconds=settings.sticky_queue_timeout),
            # Pollers follow the backlog: many terminations at once get picked up in parallel.
            workflow_task_poller_behavior=PollerBehaviorAutoscaling(),
            activity_task_poller_behavior=PollerBehaviorAutoscaling(),
        )
        self._tasks.append(asyncio.create_task(self.worker.run(), name="temporal-worker"))
        if settings.node_watcher:
            self.watcher = NodeDeletionWatcher(
                self.kube, self.client, settings.task_queue, settings.node_watcher_resync
            )
            self._tasks.append(asyncio.create_task(self.watcher.run(), name="node-deletion-watcher"))
        if settings.health:
            await self._serve_health()
        log.info(
            "worker running: task queue %s on %s/%s, cluster %s%s",
            settings.task_queue,
            self.client.service_client.config.target_host,
            self.client.namespace,
            settings.cluster_name,
            f", health on port {self.health_port}" if self.health_port else "",
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    @property
    def ready(self) -> bool:
        running = self.worker is not None and self.worker.is_running
        watching = self.watcher is None or self.watcher.synced
        return running and watching

    async def wait(self) -> None:
        """Until the Temporal worker stops (it raises if it failed)."""
        await self._tasks[0]

    async def shutdown(self) -> None:
        if self.worker is not None and self.worker.is_running:
            await self.worker.shutdown()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self._health is not None:
            await self._health.cleanup()
            self._health = None
        if self._owns_kube and self.kube is not None:
            await self.kube.close()
            self.kube = None

    async def _serve_health(self) -> None:
        from aiohttp import web

        async def healthz(_: web.Request) -> web.Response:
            # Liveness: the event loop answers. A stuck loop fails the probe and the pod restarts.
            return web.json_response({"status": "ok"})

        async def readyz(_: web.Request) -> web.Response:
            ok = self.ready
            return web.json_response({"ready": ok}, status=200 if ok else 503)

        app = web.Application()
        app.add_routes([web.get("/healthz", healthz), web.get("/readyz", readyz)])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.settings.health_host, self.settings.health_port)
        await site.start()
        self._health = runner
        sockets = site._server.sockets if site._server else []  # type: ignore[union-attr]
        self.health_port = sockets[0].getsockname()[1] if sockets else self.settings.health_port


async def serve(settings: WorkerSettings) -> None:
    """Run until SIGTERM or SIGINT, then shut down gracefully."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with KarpflowWorker(settings) as running:
        stopped = asyncio.create_task(stop.wait())
        worker_done = asyncio.create_task(running.wait())
        done, _ = await asyncio.wait({stopped, worker_done}, return_when=asyncio.FIRST_COMPLETED)
        if stopped in done:
            log.info(
                "signal received: draining in-flight activities for up to %ss", settings.graceful_shutdown
            )
        else:
            worker_done.result()  # re-raise a fatal worker error
        stopped.cancel()


# -- the command ---------------------------------------------------------------------------------------


def _option(name: str, **kwargs: Any) -> Any:
    field = WorkerSettings.model_fields[name]
    flag = "--" + name.replace("_", "-")
    default = "" if field.is_required() or field.default is None else f" (default: {field.default})"
    help_text = (field.description or "") + default + f" [env KARPFLOW_{name.upper()}]"
    return click.option(flag, name, default=None, show_default=False, help=help_text.strip(), **kwargs)


_BOOL_FLAGS = ("temporal_tls", "register_search_attributes", "node_watcher", "health")


def _flag(name: str) -> Any:
    field = WorkerSettings.model_fields[name]
    flag = "--" + name.replace("_", "-")
    return click.option(
        f"{flag}/--no-{name.replace('_', '-')}",
        name,
        default=None,
        help=f"{field.description or ''} [env KARPFLOW_{name.upper()}]".strip(),
    )


def _all_options(command: Any) -> Any:
    for name in reversed(list(WorkerSettings.model_fields)):
        command = (_flag(name) if name in _BOOL_FLAGS else _option(name))(command)
    return command


@click.command("worker")
@_all_options
def cli(**flags: Any) -> None:
    """Run the karpflow worker (workflows, activities, node-deletion watcher, health endpoint)."""
    given = {name: value for name, value in flags.items() if value is not None}
    try:
        settings = WorkerSettings(**given)
    except ValidationError as err:
        click.echo(explain(err), err=True)
        sys.exit(2)
    configure_logging(settings)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(settings))


if __name__ == "__main__":
    cli()
