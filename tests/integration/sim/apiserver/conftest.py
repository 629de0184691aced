"""One emulator per test module (in its own thread), emptied before every test."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from sim.apiserver import EmulatorServer
from sim.timescale import TimeScale

from .helpers import fresh


@pytest.fixture(scope="module")
def emulator_server() -> Iterator[EmulatorServer]:
    with EmulatorServer(timescale=TimeScale(0.01), bookmark_interval=0.2) as srv:
        yield srv


@pytest.fixture
def emu(emulator_server: EmulatorServer) -> EmulatorServer:
    return fresh(emulator_server, 0.01)


@pytest.fixture
def api(emu: EmulatorServer) -> Iterator[client.ApiClient]:
    api_client = emu.api_client()
    try:
        yield api_client
    finally:
        api_client.close()


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture
def policy(api: client.ApiClient) -> client.PolicyV1Api:
    return client.PolicyV1Api(api)


@pytest.fixture
def apps(api: client.ApiClient) -> client.AppsV1Api:
    return client.AppsV1Api(api)


@pytest.fixture
def custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


KUBECTL = shutil.which("kubectl")


@pytest.fixture
def kubectl(emu: EmulatorServer, tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """The real kubectl against `emu`; `stdin` is an object sent as YAML (`-f -`)."""
    if KUBECTL is None:
        pytest.skip("kubectl is not on PATH; these tests need the real kubectl v1.32")
    config = emu.write_kubeconfig(tmp_path / "kubeconfig")
    env = {**os.environ, "KUBECONFIG": str(config), "HOME": str(tmp_path)}  # HOME: a private discovery cache

    def run(
        *args: str, check: bool = True, timeout: float = 30, stdin: object = None
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [KUBECTL, *args],
            env=env,
            input=None if stdin is None else yaml.safe_dump(stdin),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
        return proc

    run.env = env  # type: ignore[attr-defined]
    return run
