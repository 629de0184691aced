"""One emulator per test module (in its own thread), emptied before every test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
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
