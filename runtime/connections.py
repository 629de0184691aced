"""Connections to what the worker talks to: Temporal (plain, TLS, mTLS or an API key, with karpflow's
pydantic payloads), Kubernetes (kubeconfig, in-cluster, or the emulator's plain URL) and EC2 (the
standard AWS credential chain, with an endpoint override for moto)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from typing import Any, Literal

from temporalio.client import Client, Interceptor
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter, DefaultFailureConverterWithEncodedAttributes
from temporalio.service import TLSConfig

from api import search_attributes
from kube.client import KubeApi
from runtime.metrics import temporal_runtime
from runtime.payload_codec import codec_from_file
from runtime.settings import WorkerSettings

log = logging.getLogger("karpflow.worker")


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
        api_key=settings.temporal_api_key_value(),
        tls=tls,
        data_converter=data_converter(settings),
        interceptors=list(interceptors),
        # The SDK's metrics go to /metrics with karpflow's (runtime/metrics.py).
        runtime=temporal_runtime() if settings.metrics else None,
    )


def data_converter(settings: WorkerSettings) -> DataConverter:
    """karpflow's payloads (pydantic models); with a payload key file, encrypted, failures included
    (their messages name nodes and pods: they move into the encrypted attributes)."""
    codec = codec_from_file(settings.payload_key_file)
    if codec is None:
        return pydantic_data_converter
    return dataclasses.replace(
        pydantic_data_converter,
        payload_codec=codec,
        failure_converter_class=DefaultFailureConverterWithEncodedAttributes,
    )


class TemporalUnreachable(RuntimeError):
    """Temporal did not answer within the worker's connect timeout."""


async def connect_temporal_patiently(
    settings: WorkerSettings, interceptors: Sequence[Interceptor] = ()
) -> Client:
    """The worker's connection: a Temporal server that is restarting (an upgrade, a failover) is
    waited for, with one log line per attempt, up to `temporal_connect_timeout` seconds; only then does
    the worker exit. A worker that exited instead would come back only at its pod's next restart, after
    Kubernetes' crash-loop backoff. (CLI commands connect once and fail at once.)"""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.temporal_connect_timeout
    delay = 0.5
    while True:
        try:
            return await connect_temporal(settings, interceptors)
        except RuntimeError as err:  # the SDK's "Failed client connect: ..."
            if loop.time() + delay > deadline:
                raise TemporalUnreachable(
                    f"cannot reach Temporal at {settings.temporal_address} within "
                    f"{settings.temporal_connect_timeout:g}s (--temporal-connect-timeout): "
                    + " ".join(str(err).split())[:300]
                ) from err
            log.warning(
                "Temporal at %s does not answer (%s); trying again in %.1fs",
                settings.temporal_address,
                " ".join(str(err).split())[:300],
                delay,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)


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
        # A URL (the local emulator): with a bearer token and CA when the server checks them.
        token = settings.kube_token_file.read_text().strip() if settings.kube_token_file else None
        return KubeApi.for_host(
            settings.kube_api_server,
            settings.kube_request_timeout,
            token=token,
            ca_file=str(settings.kube_ca_file) if settings.kube_ca_file else None,
            qps=settings.kube_client_qps,
            burst=settings.kube_client_burst,
        )
    return await KubeApi.connect(
        str(settings.kubeconfig) if settings.kubeconfig else None,
        settings.kube_context,
        settings.kube_request_timeout,
        token_file=str(settings.kube_token_file) if settings.kube_token_file else None,
        ca_file=str(settings.kube_ca_file) if settings.kube_ca_file else None,
        qps=settings.kube_client_qps,
        burst=settings.kube_client_burst,
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


def aws_client(service: Literal["eks", "iam"], settings: WorkerSettings) -> Any:
    """EKS (DescribeCluster, once) and IAM (instance profiles for a role): few calls, default config."""
    import boto3

    return boto3.client(service, region_name=settings.aws_region, endpoint_url=settings.aws_endpoint_url)


def sqs_client(settings: WorkerSettings) -> Any:
    """The interruption queue's client (same region and endpoint override as EC2)."""
    import boto3
    from botocore.config import Config

    # One connection per message handled at once, plus the long poll.
    config = Config(max_pool_connections=settings.interruption_concurrency + 2)
    return boto3.client(
        "sqs", region_name=settings.aws_region, endpoint_url=settings.aws_endpoint_url, config=config
    )
