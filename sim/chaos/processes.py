"""The processes a chaos run kills and starts again: the Temporal dev server and karpflow workers.

`TemporalServer` is `temporal server start-dev` on a database file, so a restart (same port, same
file) finds every workflow where it was. `Workers` runs `karpflow worker` processes configured only
through the environment, as a Deployment's pods are, and kills them with SIGKILL: no graceful
shutdown, activities and workflow tasks cut wherever they were.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from api import search_attributes
from sim.binaries import temporal_cli
from sim.devstack import temporal_serving
from sim.ports import free_port

PROJECT_ROOT = Path(__file__).resolve().parents[2]


class ProcessError(RuntimeError):
    pass


@dataclass
class TemporalServer:
    """The dev server on `db_file`, headless, no outbound calls."""

    state_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def db_file(self) -> Path:
        return self.state_dir / "temporal.db"

    def start(self, ready_within: float = 60.0) -> None:
        if self.port == 0:
            self.port = free_port(self.host)
        log = (self.state_dir / "temporal.log").open("ab")
        argv = [
            temporal_cli(),
            "server",
            "start-dev",
            "--ip",
            self.host,
            "--port",
            str(self.port),
            "--headless",
            "--db-filename",
            str(self.db_file),
            "--log-level",
            "warn",
            "--dynamic-config-value",
            "frontend.enableServerVersionCheck=false",
        ]
        with log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + ready_within
        while not temporal_serving(self.address, timeout=3):
            if self.process.poll() is not None:
                raise ProcessError(
                    f"the Temporal dev server exited ({self.process.returncode}); see temporal.log"
                )
            if time.monotonic() > deadline:
                raise ProcessError(f"the Temporal dev server was not serving after {ready_within:.0f}s")
            time.sleep(0.2)

    def register_search_attributes(self) -> None:
        argv = [temporal_cli(), "operator", "search-attribute", "create", "--address", self.address]
        for key in search_attributes.ALL:
            argv += ["--name", key.name, "--type", search_attributes.cli_type(key)]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if result.returncode != 0:
            raise ProcessError(f"registering search attributes failed: {result.stderr.strip()}")

    def stop(self, sig: int = signal.SIGTERM, within: float = 20.0) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(sig)
        try:
            process.wait(within)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)

    def restart(self, down_for: float = 1.0) -> None:
        """Stop it, stay down `down_for` seconds (clients see it gone), start it on the same file."""
        self.stop()
        time.sleep(down_for)
        self.start()
        self.restarts += 1


@dataclass
class WorkerProcess:
    name: str
    process: subprocess.Popen[bytes]
    started: float

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None


@dataclass
class Workers:
    """`karpflow worker` processes sharing one task queue and one environment."""

    env: dict[str, str]
    log_dir: Path
    running: dict[str, WorkerProcess] = field(default_factory=dict)
    kills: int = 0
    starts: int = 0
    exits: list[str] = field(default_factory=list)  # unexpected exits: "<name> exited with <code>"

    def start(self, name: str) -> WorkerProcess:
        existing = self.running.get(name)
        if existing is not None and existing.alive():
            return existing
        log = (self.log_dir / f"worker-{name}.log").open("ab")
        with log:
            log.write(f"\n=== {time.strftime('%H:%M:%S')} start\n".encode())
            log.flush()
            process = subprocess.Popen(
                [sys.executable, "-m", "cli", "worker"],
                cwd=PROJECT_ROOT,
                env={**os.environ, **self.env},
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
            )
        worker = WorkerProcess(name, process, time.monotonic())
        self.running[name] = worker
        self.starts += 1
        return worker

    def kill(self, name: str) -> bool:
        """SIGKILL: the worker gets no chance to finish or hand back anything."""
        worker = self.running.pop(name, None)
        if worker is None or not worker.alive():
            return False
        worker.process.send_signal(signal.SIGKILL)
        worker.process.wait(10)
        self.kills += 1
        return True

    def stop(self, name: str, within: float = 15.0) -> None:
        """SIGTERM, as a rollout does (graceful shutdown), then SIGKILL."""
        worker = self.running.pop(name, None)
        if worker is None or not worker.alive():
            return
        worker.process.send_signal(signal.SIGTERM)
        try:
            worker.process.wait(within)
        except subprocess.TimeoutExpired:
            worker.process.kill()
            worker.process.wait(10)

    def check(self) -> None:
        """Record workers that died on their own (a crash is a finding, not a fault we injected)."""
        for name, worker in list(self.running.items()):
            code = worker.process.poll()
            if code is not None:
                self.exits.append(f"worker {name} (pid {worker.pid}) exited with {code}")
                del self.running[name]

    def stop_all(self) -> None:
        for name in list(self.running):
            with contextlib.suppress(Exception):
                self.stop(name)

    def alive(self) -> list[str]:
        return sorted(name for name, worker in self.running.items() if worker.alive())
