"""The worker's settings: every flag has an environment variable (`KARPFLOW_<FLAG>`), flags win, and a
bad value stops the worker with a message naming the flag and the variable before anything connects.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import click
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from planner.model import PlanOptions


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
    temporal_api_key_file: Path | None = Field(
        default=None, description="API key in a file, e.g. a mounted Secret; implies TLS"
    )
    temporal_connect_timeout: float = Field(
        default=300.0,
        ge=0,
        description="seconds the worker keeps trying to reach Temporal at start-up (a server restarting, "
        "an upgrade) before it exits",
    )
    payload_key_file: Path | None = Field(
        default=None,
        description="AES-256 keys (`<id>=<base64>` lines, the newest last, e.g. a mounted Secret): "
        "payloads are encrypted in Temporal's history (runtime/payload_codec.py, SECURITY.md)",
    )
    register_search_attributes: bool = True
    # Kubernetes
    kubeconfig: Path | None = Field(default=None, description="default: in-cluster, else ~/.kube/config")
    kube_context: str | None = None
    kube_api_server: str | None = Field(
        default=None,
        description="API server URL, no kubeconfig (the local emulator); token and CA files if it checks",
    )
    kube_request_timeout: float = Field(default=30.0, gt=0)
    kube_client_qps: float = Field(
        default=200.0,
        gt=0,
        description="the smoothed rate of requests to the API server a second (client-go's token "
        "bucket; Karpenter's default)",
    )
    kube_client_burst: int = Field(
        default=300,
        ge=1,
        description="the most requests sent at once above kube-client-qps (Karpenter's default)",
    )
    kube_token_file: Path | None = Field(
        default=None,
        description="ServiceAccount token (in-cluster default: where Kubernetes mounts it)",
    )
    kube_ca_file: Path | None = Field(
        default=None,
        description="cluster CA (in-cluster default: where Kubernetes mounts it)",
    )
    # AWS
    aws_region: str | None = Field(default=None, description="default: the AWS SDK's (AWS_REGION, profile)")
    aws_endpoint_url: str | None = Field(default=None, description="EC2 endpoint override, e.g. moto")
    ec2_threads: int = Field(default=32, ge=1, description="concurrent EC2 calls (boto3 is synchronous)")
    cluster_endpoint: str | None = Field(
        default=None, description="API server URL for new nodes' bootstrap; default: EKS DescribeCluster"
    )
    cluster_ca_bundle: str | None = Field(
        default=None, description="the cluster CA (base64 PEM) for new nodes; default: EKS DescribeCluster"
    )
    service_cidr: str | None = Field(
        default=None, description="the service CIDR (kube-dns address); default: EKS DescribeCluster"
    )
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
    node_watcher_resync: float = Field(
        default=300.0,
        gt=0,
        description="seconds the node-deletion watcher's watch runs before it is opened again from its "
        "last version (a listing only at start and after a watch error)",
    )
    node_watcher_retry: float = Field(
        default=30.0,
        gt=0,
        description="seconds before a failed termination of a deleting node runs again (doubling)",
    )
    # The controller (workflows/controller.py): one ControllerWorkflow per cluster, started by every
    # worker (idempotently); this worker's informer cache is what its passes plan on.
    controller: bool = Field(
        default=True, description="start the cluster's ControllerWorkflow and plan passes"
    )
    controller_interval: float = Field(
        default=10.0, gt=0, description="seconds between passes that did nothing"
    )
    controller_validation: float = Field(
        default=15.0, ge=0, description="seconds a consolidation command waits before it is re-validated"
    )
    drift_per_pass: int = Field(
        default=100,
        ge=1,
        le=1000,
        description="drift commands one pass may start, validated together, each within the Drifted "
        "budget and the other controls; 1 is Karpenter's pace (one per pass)",
    )
    approval_recheck_interval: float = Field(
        default=300.0,
        gt=0,
        description="seconds between the checks of a command waiting for approval (is its plan still "
        "good; does its NodePool still ask for approval?), given to the commands this worker plans",
    )
    # The garbage collection of karpflow's own launches (docs/garbage-collection.md): given to the
    # controller when a worker starts it, as controller_interval is.
    gc_interval: float = Field(
        default=120.0,
        ge=0,
        description="seconds between garbage collections of instances karpflow launched for commands "
        "that closed without them (Karpenter's: 2 min); 0: none",
    )
    gc_grace: float = Field(
        default=30.0,
        ge=0,
        description="seconds after its launch before such an instance with no Node is terminated "
        "(Karpenter's instance garbage collection: 30 s)",
    )
    gc_registration_ttl: float = Field(
        default=900.0,
        ge=0,
        description="seconds after its launch before such an instance whose Node never initialized is "
        "terminated and the Node deleted (Karpenter's registration TTL: 15 min)",
    )
    node_overlay: bool = Field(
        default=False,
        description="Karpenter's NodeOverlay feature gate (off by default, as Karpenter's): the cluster's "
        "NodeOverlays change the prices and extended capacity the planner decides on",
    )
    cache_stale_after: float = Field(
        default=60.0,
        gt=0,
        description="seconds the informer cache may go without a working watch or listing of a kind "
        "before planning stops and /readyz turns red (both recover on their own)",
    )
    controller_supervise_interval: float = Field(
        default=30.0,
        gt=0,
        description="seconds between checks that the controller runs: one that failed or was "
        "terminated is started again (a stopped one is left stopped)",
    )
    min_values_policy: Literal["Strict", "BestEffort"] = Field(
        default="Strict",
        description="NodePool minValues on replacements, as Karpenter's --min-values-policy (set both alike "
        "beside Karpenter): Strict refuses a replacement whose instance types span too few values, "
        "BestEffort lowers minValues to what they reach",
    )
    # Notifications (activities/notifications.py, docs/operator-controls.md "Notifications")
    notify_webhook_secret: str | None = Field(
        default=None,
        description="NAMESPACE/NAME of a Secret holding the webhook URL notifications are posted to "
        "(approval pending, command failed, drain stuck, rollout finished); unset: none are sent",
    )
    notify_webhook_key: str = Field(default="url", description="the key of that Secret holding the URL")
    notify_format: Literal["slack", "json"] = Field(
        default="slack", description="slack: {text} as Slack's incoming webhooks take it; json: every field"
    )
    # The cluster-health breaker (planner/health_breaker.py, docs/operator-controls.md)
    breaker: bool = Field(
        default=True,
        description="pause voluntary disruption while the cluster is unhealthy (NotReady nodes, pods "
        "pending long); it lifts on its own when the cluster recovers",
    )
    breaker_max_unready_percent: float = Field(
        default=45.0,
        ge=0,
        le=100,
        description="the breaker opens when more than this share of nodes is NotReady (and more than "
        "--breaker-ok-unready-count), as Cluster Autoscaler's --max-total-unready-percentage",
    )
    breaker_ok_unready_count: int = Field(
        default=3, ge=0, description="NotReady nodes the breaker always tolerates (--ok-total-unready-count)"
    )
    breaker_max_pending_pods: int = Field(
        default=100,
        ge=0,
        description="the breaker opens when more pods than this have been pending longer than "
        "--breaker-pending-for (0: never for pending pods)",
    )
    breaker_pending_for: float = Field(default=600.0, gt=0, description="seconds before a pending pod counts")
    # Beside Karpenter (docs/running-beside-karpenter.md)
    karpenter_coexistence: bool = Field(
        default=False,
        description="Karpenter runs in the cluster too: replacements are NodeClaims Karpenter launches, "
        "Karpenter drains and terminates the nodes of NodeClaims, and karpflow taints "
        "karpflow.dev/disrupted instead of karpenter.sh/disrupted",
    )
    # Operations
    health: bool = Field(default=True, description="serve /healthz (liveness) and /readyz (readiness)")
    health_port: int = Field(default=8080, ge=0, le=65535, description="0: any free port")
    health_host: str = "0.0.0.0"
    metrics: bool = Field(
        default=True,
        description="serve Prometheus /metrics on the health port, the Temporal SDK's metrics included",
    )
    otel_exporter: Literal["none", "console", "otlp"] = "none"
    otel_endpoint: str | None = None
    log_format: Literal["json", "text"] = "json"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # Interruption handling (issue 10; docs/interruption.md)
    interruption_queue: str | None = Field(
        default=None,
        description="SQS queue (name or URL) of EC2 interruption events; off when unset",
    )
    interruption_wait: int = Field(default=20, ge=0, le=20, description="SQS long-poll seconds")
    interruption_concurrency: int = Field(
        default=50, gt=0, description="interruption messages handled at once"
    )

    @field_validator("notify_webhook_secret")
    @classmethod
    def _secret_ref(cls, value: str | None) -> str | None:
        if value is not None:
            namespace, _, name = value.partition("/")
            if not namespace or not name or "/" in name:
                raise ValueError(f"{value!r}: give the Secret as NAMESPACE/NAME")
        return value

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

    @field_validator(
        "temporal_tls_cert", "temporal_tls_key", "temporal_tls_ca", "kubeconfig", "temporal_api_key_file"
    )
    @classmethod
    def _readable(cls, value: Path | None) -> Path | None:
        if value is not None and not value.expanduser().is_file():
            raise ValueError(f"file {value} does not exist")
        return value.expanduser() if value is not None else None

    @field_validator("payload_key_file")
    @classmethod
    def _keyring(cls, value: Path | None) -> Path | None:
        if value is None:
            return None
        from runtime.payload_codec import KeyFileError, load_keyring

        try:
            load_keyring(value.expanduser())
        except KeyFileError as err:
            raise ValueError(str(err)) from None
        return value.expanduser()

    @model_validator(mode="after")
    def _consistent(self) -> WorkerSettings:
        if (self.temporal_tls_cert is None) != (self.temporal_tls_key is None):
            raise ValueError("temporal_tls_cert and temporal_tls_key must be given together")
        if self.temporal_api_key and self.temporal_api_key_file:
            raise ValueError("give temporal_api_key or temporal_api_key_file, not both")
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
            or self.temporal_api_key_file
        )

    def temporal_api_key_value(self) -> str | None:
        """The API key, from the setting or its file (read at each connection, so a rotated Secret
        is picked up when the worker restarts)."""
        if self.temporal_api_key_file is not None:
            return self.temporal_api_key_file.read_text().strip() or None
        return self.temporal_api_key.get_secret_value() if self.temporal_api_key else None


# KARPFLOW_* variables that other parts of karpflow read (the dev stack, the CLI, tests), not the worker.
OTHER_VARIABLES = frozenset(
    {
        "KARPFLOW_STATE_DIR",
        "KARPFLOW_SIM_URL",
        "KARPFLOW_METRICS_URL",
        "KARPFLOW_UI",
        "KARPFLOW_UI_PORT",
        "KARPFLOW_TEMPORAL_PORT",
        "KARPFLOW_MOTO_PORT",
        "KARPFLOW_KUBE_PORT",
        "KARPFLOW_TIME_SCALE",
        "KARPFLOW_RECORD_HISTORIES",
        "KARPFLOW_HISTORY_NAME",
        "KARPFLOW_INTERRUPTION_WAIT",
    }
)


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """`KARPFLOW_*` variables no setting reads, each with the setting it was probably meant to be: a
    typo (KARPFLOW_CONTROLER=false) would otherwise be ignored without a word."""
    known = {f"KARPFLOW_{name.upper()}" for name in WorkerSettings.model_fields} | OTHER_VARIABLES
    lines = []
    for name in sorted(n for n in environ if n.startswith("KARPFLOW_") and n not in known):
        close = difflib.get_close_matches(name, sorted(known), n=1)
        lines.append(f"{name} is not a karpflow setting" + (f" (did you mean {close[0]}?)" if close else ""))
    return lines


def explain(err: ValidationError) -> str:
    """One line per bad setting, naming the flag and the environment variable."""
    lines = ["invalid worker settings:"]
    for problem in err.errors(include_url=False):
        field = str(problem["loc"][0]) if problem["loc"] else ""
        where = f"--{field.replace('_', '-')} / KARPFLOW_{field.upper()}" if field else "settings"
        lines.append(f"  {where}: {problem['msg']}")
    return "\n".join(lines)


# -- the settings as click options ----------------------------------------------------------------


def _option(name: str, **kwargs: Any) -> Any:
    field = WorkerSettings.model_fields[name]
    flag = "--" + name.replace("_", "-")
    default = "" if field.is_required() or field.default is None else f" (default: {field.default})"
    help_text = (field.description or "") + default + f" [env KARPFLOW_{name.upper()}]"
    return click.option(flag, name, default=None, show_default=False, help=help_text.strip(), **kwargs)


def _flag(name: str) -> Any:
    field = WorkerSettings.model_fields[name]
    flag = "--" + name.replace("_", "-")
    return click.option(
        f"{flag}/--no-{name.replace('_', '-')}",
        name,
        default=None,
        help=f"{field.description or ''} [env KARPFLOW_{name.upper()}]".strip(),
    )


def settings_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a click command with one option per setting (default None: unset ones come from the
    environment or the field's default)."""
    for name in reversed(list(WorkerSettings.model_fields)):
        command = (_flag(name) if WorkerSettings.model_fields[name].annotation is bool else _option(name))(
            command
        )
    return command


def plan_options(settings: WorkerSettings) -> PlanOptions:
    """The planner's options the worker's settings choose (the rest are Karpenter's defaults)."""
    return PlanOptions(
        min_values_policy=settings.min_values_policy,
        node_overlay=settings.node_overlay,
        drift_commands_per_pass=settings.drift_per_pass,
        breaker=settings.breaker,
        breaker_max_unready=settings.breaker_max_unready_percent / 100,
        breaker_ok_unready=settings.breaker_ok_unready_count,
        breaker_max_pending_pods=settings.breaker_max_pending_pods,
        breaker_pending_for=timedelta(seconds=settings.breaker_pending_for),
    )
