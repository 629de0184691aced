"""The local development stack: Temporal dev server, the simulator process and the worker.

`karpflow dev up` starts each part as a background process with a pid file and a log under the
state directory (`.state/` at the project root unless `--state-dir` / `KARPFLOW_STATE_DIR` says
otherwise), waits until each one answers, registers the search attributes and writes a kubeconfig
for the Kubernetes emulator. `dev status` reports what runs; `dev down` stops only the processes
whose pid files it wrote, gracefully (SIGTERM) and then forcefully (SIGKILL).

Layout of the state directory:

    dev.json            the settings the running stack was started with (ports, cluster, scenario)
    temporal.db         Temporal's persistent store (kept by `dev down`, removed by `--purge`)
    kubeconfig          points kubectl at the emulator (and the worker, unless --secure)
    tls/ca.crt          --secure: the CA of the emulator's certificate (new at each start)
    serviceaccount/     --secure: the worker's ServiceAccount token and ca.crt (sim/dev_identity.py)
    env                 `export ...` lines for the shell: KUBECONFIG, TEMPORAL_ADDRESS, AWS_*
    <part>.pid          one per running part (temporal, sim, worker)
    logs/<part>.log     stdout and stderr of each part, appended across runs

A process is "ours" only if the pid in its file is alive *and* was created before the pid file
was written (so a recycled pid is never signalled) — see `_owned_process`.
"""

from __future__ import annotations

import ast
import base64
import contextlib
import importlib.util
import json
import os
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from api import search_attributes
from sim import dev_identity
from sim.binaries import temporal_cli
from sim.controllers.bootstrap import SIM_CA_BUNDLE, SIM_SERVICE_CIDR
from sim.interruption_queue import ensure_interruption_queue
from sim.ports import free_port, port_is_free

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SCENARIO = Path(__file__).resolve().parent / "scenarios" / "demo.yaml"
RETIRED_REASON = "karpflow dev up: a new simulated cluster replaced the one this workflow acted on"


def default_state_dir() -> Path:
    """`.state/` beside pyproject.toml in a checkout (editable install), else in the current directory."""
    if (PROJECT_ROOT / "pyproject.toml").is_file():
        return PROJECT_ROOT / ".state"
    return Path.cwd() / ".state"


class DevStackError(RuntimeError):
    """Something the user can act on: a busy port, a part that would not start."""


class DevSettings(BaseSettings):
    """Where the stack lives and which ports it takes. Every field has a `KARPFLOW_<NAME>` variable."""

    model_config = SettingsConfigDict(env_prefix="KARPFLOW_", extra="ignore")

    state_dir: Path = Field(default_factory=default_state_dir)
    host: str = "127.0.0.1"
    temporal_port: int = 7233
    ui_port: int = 8233
    kube_port: int = 6443
    moto_port: int = 4566
    temporal_namespace: str = "default"
    cluster_name: str = "karpflow-dev"
    region: str = "us-west-2"
    scenario: Path | None = DEFAULT_SCENARIO
    time_scale: float = 1.0
    ui: bool = True
    worker: bool = True
    # HTTPS, tokens and RBAC on the emulator; the worker runs as its ServiceAccount (sim/dev_identity.py).
    secure: bool = False
    # A simulated Karpenter beside karpflow, and the worker in its coexistence mode
    # (docs/running-beside-karpenter.md).
    karpenter_neighbour: bool = False
    # The worker's /healthz and /readyz; 0 picks a free port at `up` (recorded in dev.json).
    worker_health_port: int = 0
    # SQS queue (in moto) that EventBridge rules feed EC2 interruption events into (docs/interruption.md).
    interruption_queue_name: str = "karpflow-dev-interruption"
    # How long one part may take to become ready before `up` gives up and stops what it started.
    ready_timeout: float = 60.0

    @property
    def temporal_address(self) -> str:
        return f"{self.host}:{self.temporal_port}"

    @property
    def kube_url(self) -> str:
        return f"{'https' if self.secure else 'http'}://{self.host}:{self.kube_port}"

    @property
    def tls_dir(self) -> Path:
        return self.state_dir / "tls"

    @property
    def serviceaccount_dir(self) -> Path:
        return self.state_dir / "serviceaccount"

    def ca_bundle(self) -> str:
        """What new nodes' user data carries: the secure emulator's CA once written, else any."""
        ca = self.tls_dir / "ca.crt"
        return base64.b64encode(ca.read_bytes()).decode() if self.secure and ca.is_file() else SIM_CA_BUNDLE

    @property
    def ec2_endpoint(self) -> str:
        return f"http://{self.host}:{self.moto_port}"

    @property
    def interruption_queue_url(self) -> str:
        # moto's URL for a queue of its default account, as create_queue returns it.
        return f"{self.ec2_endpoint}/123456789012/{self.interruption_queue_name}"

    @property
    def ui_url(self) -> str:
        return f"http://{self.host}:{self.ui_port}"

    @property
    def kubeconfig_path(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def db_path(self) -> Path:
        return self.state_dir / "temporal.db"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.worker_health_port}/metrics"

    def client_env(self) -> dict[str, str]:
        """What a client (the worker, kubectl, boto3, the temporal CLI, every `karpflow` subcommand)
        needs to reach the stack."""
        return {
            # `karpflow dev status|down`, `karpflow sim`: this stack, not the default .state/
            "KARPFLOW_STATE_DIR": str(self.state_dir),
            "KARPFLOW_SIM_URL": self.kube_url,
            **({"KARPFLOW_METRICS_URL": self.metrics_url} if self.worker and self.worker_health_port else {}),
            "KUBECONFIG": str(self.kubeconfig_path),
            "TEMPORAL_ADDRESS": self.temporal_address,
            "TEMPORAL_NAMESPACE": self.temporal_namespace,
            "AWS_ENDPOINT_URL": self.ec2_endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "KARPFLOW_CLUSTER_NAME": self.cluster_name,
            "KARPFLOW_CLUSTER_ENDPOINT": self.kube_url,
            "KARPFLOW_CLUSTER_CA_BUNDLE": self.ca_bundle(),
            "KARPFLOW_SERVICE_CIDR": SIM_SERVICE_CIDR,
            # The worker's and karpflow's own settings (see `karpflow worker --help`).
            "KARPFLOW_TEMPORAL_ADDRESS": self.temporal_address,
            "KARPFLOW_TEMPORAL_NAMESPACE": self.temporal_namespace,
            "KARPFLOW_KUBECONFIG": str(self.kubeconfig_path),
            "KARPFLOW_AWS_REGION": self.region,
            "KARPFLOW_AWS_ENDPOINT_URL": self.ec2_endpoint,
            "KARPFLOW_INTERRUPTION_QUEUE": self.interruption_queue_url,
        }


@dataclass
class Part:
    """One background process of the stack and how to tell that it works."""

    name: str
    argv: list[str]
    ports: dict[str, int]  # label -> port it listens on, checked free before start
    probe: Callable[[], bool]  # True once it answers
    describe: str
    env: dict[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()  # variables of the calling shell the part must not see
    # A line of its log that means "start it again" (once): a port the part picked for itself was
    # taken between its pick and its bind.
    restart_if: str | None = None


@dataclass
class PartStatus:
    name: str
    running: bool
    pid: int | None
    healthy: bool
    detail: str


# ----------------------------------------------------------------------------------------------
# Probes


def temporal_serving(address: str, timeout: float = 5.0) -> bool:
    try:
        result = subprocess.run(
            [temporal_cli(), "operator", "cluster", "health", "--address", address],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False
    return "SERVING" in result.stdout


def http_json(url: str, timeout: float = 2.0, ca_file: Path | None = None) -> Any | None:
    try:
        context = None
        if url.startswith("https://"):
            if ca_file is None or not ca_file.is_file():
                return None  # the secure emulator has not written its CA yet
            context = ssl.create_default_context(cafile=str(ca_file))
        with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
            return json.loads(response.read() or b"null")
    except (urllib.error.URLError, OSError, ValueError):
        return None


def simulator_ready(kube_url: str, ca_file: Path | None = None) -> bool:
    status = http_json(f"{kube_url}/sim/status", ca_file=ca_file)
    return isinstance(status, dict) and bool(status.get("ready"))


# ----------------------------------------------------------------------------------------------
# Processes


def _psutil():
    try:
        import psutil
    except ImportError as err:  # psutil is in the dev extra, like moto: the dev stack needs both
        raise DevStackError("the dev stack needs the dev extra: run `make install`") from err
    return psutil


def _owned_process(pid_file: Path):
    """The psutil.Process recorded in pid_file if it is still the one we started, else None."""
    psutil = _psutil()
    try:
        pid = int(pid_file.read_text().split()[0])
        written = pid_file.stat().st_mtime
        process = psutil.Process(pid)
        # A recycled pid belongs to a process created after our pid file was written.
        if process.create_time() > written + 1.0 or process.status() == psutil.STATUS_ZOMBIE:
            return None
        return process
    except (FileNotFoundError, ValueError, IndexError, psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _wait_gone(process: Any, timeout: float) -> bool:
    """Until the process has exited. A dead process that is not our child stays a zombie until init
    reaps it, which can take a while: it counts as gone."""
    psutil = _psutil()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
            process.wait(timeout=0.05)
            return True
        except psutil.TimeoutExpired:
            continue
        except psutil.NoSuchProcess:
            return True
    return False


def worker_available() -> bool:
    """Whether `worker.py` defines the `cli` command that `karpflow worker` runs.

    Read with `ast` rather than imported: importing the worker pulls in every workflow and client
    library, which `dev status` should not pay for.
    """
    spec = importlib.util.find_spec("worker")
    if spec is None or spec.origin is None:
        return False
    try:
        tree = ast.parse(Path(spec.origin).read_text())
    except (OSError, SyntaxError):
        return False
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "cli":
            return True
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "cli" for t in node.targets
        ):
            return True
    return False


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError):
        return False


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


class DevStack:
    """Start, inspect and stop the local stack described by `settings`."""

    def __init__(self, settings: DevSettings) -> None:
        self.settings = settings

    # -- description -----------------------------------------------------------------------------

    @classmethod
    def from_state_dir(cls, state_dir: Path | None = None) -> DevStack:
        """The stack recorded in a state directory (dev.json), so status/down use its real ports."""
        settings = DevSettings() if state_dir is None else DevSettings(state_dir=state_dir)
        recorded = settings.state_dir / "dev.json"
        if recorded.is_file():
            settings = DevSettings.model_validate(json.loads(recorded.read_text()))
        return cls(settings)

    def parts(self) -> list[Part]:
        s = self.settings
        temporal = [
            temporal_cli(),
            "server",
            "start-dev",
            "--ip",
            s.host,
            "--port",
            str(s.temporal_port),
            "--db-filename",
            str(s.db_path),
            "--dynamic-config-value",
            "frontend.enableServerVersionCheck=false",
        ]
        if s.temporal_namespace != "default":  # "default" always exists
            temporal += ["--namespace", s.temporal_namespace]
        temporal_ports = {"Temporal frontend": s.temporal_port}
        if s.ui:
            temporal += ["--ui-port", str(s.ui_port), "--ui-disable-news-fetch"]
            temporal_ports["Temporal Web UI"] = s.ui_port
        else:
            temporal.append("--headless")
        simulator = [
            sys.executable,
            "-m",
            "sim",
            "--host",
            s.host,
            "--kube-port",
            str(s.kube_port),
            "--moto-port",
            str(s.moto_port),
            "--cluster-name",
            s.cluster_name,
            "--region",
            s.region,
            "--time-scale",
            str(s.time_scale),
            "--kubeconfig",
            str(s.kubeconfig_path),
        ]
        if s.scenario is not None:
            simulator += ["--scenario", str(s.scenario)]
        if s.secure:
            simulator += ["--secure-dir", str(s.tls_dir)]
        if s.karpenter_neighbour:
            simulator.append("--karpenter")
        parts = [
            Part(
                "temporal",
                temporal,
                temporal_ports,
                lambda: temporal_serving(s.temporal_address),
                f"Temporal dev server on {s.temporal_address}",
                # Its HTTP API and metrics ports are random picks of its own (start-dev --help).
                restart_if="bind: address already in use",
            ),
            Part(
                "sim",
                simulator,
                {"Kubernetes emulator": s.kube_port, "EC2 (moto)": s.moto_port},
                lambda: simulator_ready(s.kube_url, s.tls_dir / "ca.crt"),
                f"simulator: Kubernetes emulator on {s.kube_url}, EC2 on {s.ec2_endpoint}",
            ),
        ]
        if s.worker and worker_available():
            worker = [
                sys.executable,
                "-m",
                "cli",
                "worker",
                "--cluster-name",
                s.cluster_name,
                "--temporal-address",
                s.temporal_address,
                "--temporal-namespace",
                s.temporal_namespace,
                *([] if s.secure else ["--kubeconfig", str(s.kubeconfig_path)]),
                "--aws-region",
                s.region,
                "--aws-endpoint-url",
                s.ec2_endpoint,
                "--health-host",
                s.host,
                "--health-port",
                str(s.worker_health_port),
                "--log-format",
                "text",
                *(["--karpenter-coexistence"] if s.karpenter_neighbour else []),
            ]
            parts.append(
                Part(
                    "worker",
                    worker,
                    {"worker health": s.worker_health_port},
                    lambda: http_ok(f"http://{s.host}:{s.worker_health_port}/readyz"),
                    f"karpflow worker on task queue karpflow (health http://{s.host}:{s.worker_health_port})",
                    env=self._worker_env(),
                    # As its ServiceAccount only: no admin kubeconfig from the shell (`source env`).
                    unset=("KUBECONFIG", "KARPFLOW_KUBECONFIG") if s.secure else (),
                )
            )
        return parts

    def _worker_env(self) -> dict[str, str]:
        s = self.settings
        env = s.client_env()
        if not s.secure:
            return env
        # A new CA at each emulator start: the worker reads it from its "mounted" ca.crt instead.
        for name in ("KUBECONFIG", "KARPFLOW_KUBECONFIG", "KARPFLOW_CLUSTER_CA_BUNDLE"):
            env.pop(name, None)
        return {**env, **dev_identity.pod_env(s.kube_url, s.serviceaccount_dir)}

    def pid_file(self, name: str) -> Path:
        return self.settings.state_dir / f"{name}.pid"

    def log_file(self, name: str) -> Path:
        return self.settings.logs_dir / f"{name}.log"

    def process(self, name: str):
        return _owned_process(self.pid_file(name))

    # -- up --------------------------------------------------------------------------------------

    def up(self, progress: Callable[[str, str], None] = lambda name, message: None) -> list[str]:
        """Start whatever is not running; return the names started. Raises DevStackError.

        `progress(part, message)` is called as parts start and become ready. If a part fails, the
        parts this call started are stopped again (logs are kept) and the error names the cause.
        """
        s = self.settings
        s.state_dir.mkdir(parents=True, exist_ok=True)
        s.logs_dir.mkdir(parents=True, exist_ok=True)
        recorded = s.state_dir / "dev.json"
        if recorded.is_file() and any(self.process(p) for p in ("temporal", "sim", "worker")):
            # A running stack keeps its own settings: `up` again must not start a second one elsewhere.
            # Only which parts to run comes from this call: `up` after `up --no-worker` adds the worker.
            wanted_worker = s.worker
            self.settings = s = DevSettings.model_validate(json.loads(recorded.read_text()))
            s.worker = s.worker or wanted_worker
        if s.worker_health_port == 0:
            s.worker_health_port = free_port(s.host)
        parts = self.parts()
        started: list[str] = []
        new_cluster = self.process("sim") is None  # the simulator's cluster lives in its process
        if new_cluster and self.process("worker") is not None:
            # That worker serves the cluster that is gone: it must not act on the new one.
            progress("worker", "stopping: its cluster is gone")
            self._stop("worker")
        try:
            first = [p for p in parts if p.name != "worker"]
            later = [p for p in parts if p.name == "worker"]
            for part in first:
                if self._start(part, progress):
                    started.append(part.name)
            recorded.write_text(s.model_dump_json(indent=2))
            for part in first:
                self._await_ready(part, progress, quiet=part.name not in started)
            if "temporal" in started:
                progress("temporal", "registering search attributes")
            self.register_search_attributes()
            if new_cluster:
                retired = self.retire_workflows_of_previous_cluster()
                if retired:
                    progress("previous cluster", f"terminated {retired} workflow(s) of the previous cluster")
            ensure_interruption_queue(s.ec2_endpoint, s.region, s.interruption_queue_name)
            if "temporal" in started:
                progress("temporal", "ready")
            self.write_env_file()
            if s.secure and later:
                progress("worker", "applying deploy/overlays/local; token of ServiceAccount karpflow-worker")
                try:
                    dev_identity.install(s.kubeconfig_path, s.tls_dir / "ca.crt", s.serviceaccount_dir)
                except dev_identity.IdentityError as err:
                    raise DevStackError(str(err)) from None
            for part in later:
                if self._start(part, progress):
                    started.append(part.name)
                self._await_ready(part, progress, quiet=part.name not in started)
        except BaseException:
            for name in reversed(started):
                self._stop(name)
            raise
        return started

    def _start(self, part: Part, progress: Callable[[str, str], None]) -> bool:
        if self.process(part.name) is not None:
            progress(part.name, "already running")
            return False
        for label, port in part.ports.items():
            if not port_is_free(self.settings.host, port):
                raise DevStackError(
                    f"port {port} ({label}) on {self.settings.host} is in use by another process; "
                    f"stop it or choose another port (see `karpflow dev up --help`)"
                )
        log = self.log_file(part.name)
        with log.open("ab") as out:
            out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(part.argv)}\n".encode())
            out.flush()
            # A new session: Ctrl-C in the terminal that ran `dev up` must not reach the stack.
            process = subprocess.Popen(
                part.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.settings.state_dir,
                env={**{k: v for k, v in os.environ.items() if k not in part.unset}, **part.env},
                start_new_session=True,
            )
        self.pid_file(part.name).write_text(f"{process.pid}\n")
        progress(part.name, f"started (pid {process.pid})")
        return True

    def _await_ready(
        self, part: Part, progress: Callable[[str, str], None], quiet: bool = False, restarts: int = 1
    ) -> None:
        """Wait for the part's probe; `quiet` for a part that already ran (its progress line stays).
        A part whose log says `restart_if` since it started is started again, `restarts` times."""
        deadline = time.monotonic() + self.settings.ready_timeout
        if not quiet:
            progress(part.name, "waiting until ready")
        while time.monotonic() < deadline:
            if self.process(part.name) is None:
                if restarts > 0 and part.restart_if and part.restart_if in self._since_start(part.name):
                    progress(part.name, f"exited ({part.restart_if}); starting it again")
                    self._start(part, progress)
                    return self._await_ready(part, progress, quiet, restarts - 1)
                raise DevStackError(
                    f"{part.name} exited while starting; last lines of {self.log_file(part.name)}:\n"
                    f"{tail(self.log_file(part.name))}"
                )
            if part.probe():
                if not quiet:
                    progress(part.name, "ready")
                return
            time.sleep(0.1)
        raise DevStackError(
            f"{part.name} was not ready after {self.settings.ready_timeout:.0f}s; last lines of "
            f"{self.log_file(part.name)}:\n{tail(self.log_file(part.name))}"
        )

    def _since_start(self, name: str) -> str:
        """What the part logged since its last start (`_start` writes a `===` line first)."""
        try:
            text = self.log_file(name).read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return text.rsplit("\n=== ", 1)[-1]

    def register_search_attributes(self) -> None:
        """Idempotent: `search-attribute create` accepts an attribute that already exists."""
        s = self.settings
        argv = [
            temporal_cli(),
            "operator",
            "search-attribute",
            "create",
            "--address",
            s.temporal_address,
            "--namespace",
            s.temporal_namespace,
        ]
        for key in search_attributes.ALL:
            argv += ["--name", key.name, "--type", search_attributes.cli_type(key)]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        if result.returncode != 0:
            raise DevStackError(f"registering search attributes failed: {result.stderr.strip()}")

    def retire_workflows_of_previous_cluster(self) -> int:
        """Terminate every workflow still running in the Temporal database: they were started for a
        cluster that no longer exists (the simulator's cluster dies with its process, and a new one
        reuses node names), so none may resume against the new cluster. Runs before any worker of
        the new cluster starts; their histories stay for the Web UI. Returns how many."""
        import asyncio

        from temporalio.client import Client

        s = self.settings

        async def retire() -> int:
            client = await Client.connect(s.temporal_address, namespace=s.temporal_namespace)
            count = 0
            async for execution in client.list_workflows('ExecutionStatus="Running"'):
                handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
                with contextlib.suppress(Exception):  # closed meanwhile
                    await handle.terminate(reason=RETIRED_REASON)
                    count += 1
            return count

        return asyncio.run(retire())

    def write_env_file(self) -> Path:
        """`source` it: every variable of `client_env()`, and this install's `karpflow` and `temporal`
        (the virtualenv's bin directory) first on PATH."""
        path = self.settings.state_dir / "env"
        lines = [f"export {name}={shlex.quote(value)}" for name, value in self.settings.client_env().items()]
        lines.append(f'export PATH={shlex.quote(str(Path(sys.executable).parent))}:"$PATH"')
        path.write_text("\n".join(lines) + "\n")
        return path

    # -- status ----------------------------------------------------------------------------------

    def status(self) -> list[PartStatus]:
        statuses = []
        for part in self.parts_known():
            process = self.process(part.name)
            if process is None:
                statuses.append(PartStatus(part.name, False, None, False, "not running"))
                continue
            healthy = part.probe()
            statuses.append(
                PartStatus(
                    part.name, True, process.pid, healthy, part.describe if healthy else "not answering"
                )
            )
        return statuses

    def parts_known(self) -> list[Part]:
        """The parts to report on: the configured ones, plus a worker that runs without being configured."""
        parts = self.parts()
        if all(p.name != "worker" for p in parts) and self.process("worker") is not None:
            parts.append(Part("worker", [], {}, lambda: True, "karpflow worker"))
        return parts

    def running(self) -> bool:
        return any(self.process(name) for name in ("temporal", "sim", "worker"))

    # -- down ------------------------------------------------------------------------------------

    def down(self, purge: bool = False, grace: float = 10.0) -> list[str]:
        """Stop the parts this stack started (worker first); return their names."""
        stopped = [name for name in ("worker", "sim", "temporal") if self._stop(name, grace)]
        if purge:
            self.purge()
        return stopped

    def _stop(self, name: str, grace: float = 10.0) -> bool:
        psutil = _psutil()
        pid_file = self.pid_file(name)
        process = _owned_process(pid_file)
        stopped = False
        if process is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGTERM)
                if not _wait_gone(process, grace):
                    process.kill()
                    _wait_gone(process, 5)
            stopped = True
        pid_file.unlink(missing_ok=True)
        return stopped

    def purge(self) -> list[Path]:
        """Remove what the stack wrote: database, logs, kubeconfig, env and settings files, the
        secure stack's certificates and ServiceAccount token; then the state directory, if nothing
        else lives there. Returns what is left in it (nothing when the directory is gone), so a
        caller says only what is true."""
        s = self.settings
        for path in s.state_dir.glob("temporal.db*"):
            path.unlink()
        for name in ("dev.json", "env", "kubeconfig"):
            (s.state_dir / name).unlink(missing_ok=True)
        for directory in (s.logs_dir, s.tls_dir, s.serviceaccount_dir):
            shutil.rmtree(directory, ignore_errors=True)
        with contextlib.suppress(OSError):
            s.state_dir.rmdir()  # only if nothing else lives there
        return sorted(s.state_dir.iterdir()) if s.state_dir.is_dir() else []


def purged_message(state_dir: Path, left: list[Path]) -> str:
    """What a purge did, in words: the directory removed, or what it kept there and why."""
    if not left:
        return f"Removed {state_dir}."
    names = ", ".join(p.name + ("/" if p.is_dir() else "") for p in left)
    return (
        f"Removed the stack's database, logs, kubeconfig and env from {state_dir}; kept {state_dir}, "
        f"which still holds what the stack did not write: {names}."
    )
