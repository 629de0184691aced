"""Fixtures for the simulated-cluster controller tests: a real moto server over HTTP in process."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import boto3
import pytest
from botocore.config import Config
from moto.server import ThreadedMotoServer

from sim import ec2_faults

REGION = "us-west-2"
logging.getLogger("werkzeug").setLevel(logging.ERROR)


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{server._server.server_port}"  # type: ignore[union-attr]
    finally:
        server.stop()


def ec2_client(endpoint: str, retries: int = 1):
    return boto3.client(
        "ec2",
        region_name=REGION,
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(retries={"max_attempts": retries, "mode": "standard"}),
    )


@pytest.fixture
def ec2(moto_endpoint: str):
    return ec2_client(moto_endpoint)


@pytest.fixture
def faults() -> Iterator[ec2_faults.Ec2Faults]:
    active = ec2_faults.install(ec2_faults.Ec2Faults())
    try:
        yield active
    finally:
        ec2_faults.uninstall()


@pytest.fixture
def cluster_name() -> str:
    # moto's state is one per process: a fresh cluster name keeps tests apart without a reset.
    return f"sim-{uuid.uuid4().hex[:8]}"
