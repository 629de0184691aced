"""The Kubernetes calls karpflow makes, as plain JSON, over the official `kubernetes.aio` client.

The official client provides the transport: kubeconfig or in-cluster configuration, TLS, bearer
tokens and exec plugins, connection pooling. Requests go through its `ApiClient` with explicit REST
paths and JSON bodies rather than the generated models, for two reasons: a read-modify-write must
send back every field it read (generated models drop fields they do not know, which a PUT would
then erase), and the JSON is what the rest of karpflow reads anyway.

Every request, watches too, first takes a token from the client's bucket (QPS and burst, client-go's
and Karpenter's defaults: kube/rate_limit.py), and a 429 or 5xx that carries `Retry-After` is sent
again after that many seconds, as client-go does (an eviction's 429 is a PodDisruptionBudget's answer,
left to the drain: `evict` does not retry it).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import random
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from kubernetes.aio import client as kclient
from kubernetes.aio import config as kconfig
from kubernetes.aio.config import incluster_config
from yarl import URL

from kube.rate_limit import DEFAULT_BURST, DEFAULT_QPS, MAX_RETRIES, TokenBucket, retry_after
from runtime import metrics

Json = dict[str, Any]


class KubeError(Exception):
    """A Kubernetes API error status (what `kubernetes.aio` raises as ApiException, with the body parsed)."""

    def __init__(self, status: int, reason: str, body: str = "") -> None:
        self.status = status
        self.reason = reason
        self.body = body
        self.message = reason
        try:
            parsed = json.loads(body) if body else {}
            if isinstance(parsed, dict):
                self.message = str(parsed.get("message") or reason)
        except ValueError:
            self.message = body[:300] or reason
        super().__init__(f"{status} {reason}: {self.message}")


NODES = "/api/v1/nodes"
PODS = "/api/v1/pods"
VOLUME_ATTACHMENTS = "/apis/storage.k8s.io/v1/volumeattachments"


def read_environment_once(configuration: kclient.Configuration) -> None:
    """The official client opens its aiohttp session with `trust_env`, which makes every request look
    up ~/.netrc and the proxy variables in a thread of the default executor (two thread hops a call,
    most of a short call's cost in the worker). Both are settled here, once: the proxy the environment
    names for this API server (HTTPS_PROXY, NO_PROXY...) becomes the configuration's own proxy, and
    netrc is not read (the API server's credentials are the kubeconfig's or the ServiceAccount's; a
    netrc entry beside them made aiohttp refuse the request anyway)."""
    configuration.client_session_kwargs = {**(configuration.client_session_kwargs or {}), "trust_env": False}
    if configuration.proxy or not configuration.host:
        return
    with contextlib.suppress(LookupError):
        proxy, proxy_auth = get_env_proxy_for_url(URL(configuration.host))
        configuration.proxy = str(proxy)
        if proxy_auth is not None:
            configuration.proxy_headers = {"Proxy-Authorization": proxy_auth.encode()}


def _q(name: str) -> str:
    return quote(name, safe="")


USER_AGENT = "karpflow-worker/0.1"


class KubeApi:
    def __init__(
        self,
        api_client: kclient.ApiClient,
        request_timeout: float = 30.0,
        user_agent: str = USER_AGENT,
        limiter: TokenBucket | None = None,
    ) -> None:
        self._client = api_client
        self._client.user_agent = user_agent  # audit logs tell karpflow's calls apart
        self._timeout = request_timeout
        self.limiter = limiter if limiter is not None else TokenBucket(DEFAULT_QPS, DEFAULT_BURST)
        self.retried_after = 0  # requests sent again after a Retry-After (429, 5xx)

    # -- construction -----------------------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        kubeconfig: str | None = None,
        context: str | None = None,
        request_timeout: float = 30.0,
        connection_pool: int = 200,
        token_file: str | None = None,
        ca_file: str | None = None,
        qps: float = DEFAULT_QPS,
        burst: int = DEFAULT_BURST,
    ) -> KubeApi:
        """In-cluster configuration when running in a pod and no kubeconfig is given (the mounted
        ServiceAccount token and CA, or `token_file` / `ca_file`), else the kubeconfig."""
        configuration = kclient.Configuration()
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            loader = incluster_config.InClusterConfigLoader(
                token_filename=token_file or incluster_config.SERVICE_TOKEN_FILENAME,
                cert_filename=ca_file or incluster_config.SERVICE_CERT_FILENAME,
            )
            loader.load_and_set(configuration)
        else:
            await kconfig.load_kube_config(
                config_file=kubeconfig,
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
        configuration.connection_pool_maxsize = connection_pool
        read_environment_once(configuration)
        return cls(kclient.ApiClient(configuration), request_timeout, limiter=TokenBucket(qps, burst))

    @classmethod
    def for_host(
        cls,
        host: str,
        request_timeout: float = 30.0,
        connection_pool: int = 200,
        user_agent: str = USER_AGENT,
        token: str | None = None,
        ca_file: str | None = None,
        qps: float = DEFAULT_QPS,
        burst: int = DEFAULT_BURST,
    ) -> KubeApi:
        """An API server by URL: the local emulator (plain HTTP, no authentication), or with a
        bearer token and the CA that signed its certificate."""
        configuration = kclient.Configuration(host=host)
        if token:
            configuration.api_key = {"authorization": f"Bearer {token}"}
        if ca_file:
            configuration.ssl_ca_cert = ca_file
        configuration.connection_pool_maxsize = connection_pool
        read_environment_once(configuration)
        return cls(kclient.ApiClient(configuration), request_timeout, user_agent, TokenBucket(qps, burst))

    async def close(self) -> None:
        await self._client.close()

    # -- the transport ----------------------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        request_timeout: float | None = None,
        retry_throttled: bool = True,
    ) -> Json:
        """One call; raises KubeError for any non-2xx status. Returns the decoded JSON body. A 429 or
        5xx with `Retry-After` is sent again after it, up to client-go's 10 times, unless
        `retry_throttled` is False (the caller reads such answers itself), and while the waits stay
        within the request's timeout: an activity's call is not held for minutes (its own retry policy
        takes over)."""
        budget = request_timeout or self._timeout
        for attempt in range(MAX_RETRIES + 1):
            await self.limiter.acquire()
            response = await self._send(method, path, query, body, content_type, request_timeout)
            try:
                data = await response.read()
            finally:
                response.response.release()
            if 200 <= response.status < 300:
                return json.loads(data) if data else {}
            wait = retry_after(response.status, response.headers) if retry_throttled else None
            if wait is None or attempt == MAX_RETRIES or wait > budget:
                raise KubeError(response.status, response.reason or "", data.decode("utf-8", "replace"))
            budget -= wait
            self.retried_after += 1
            metrics.KUBE_CLIENT_RETRY_AFTER.labels(code=str(response.status)).inc()
            await asyncio.sleep(wait)
        raise AssertionError("unreachable")

    async def _send(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None,
        body: Any,
        content_type: str,
        request_timeout: float | None,
    ) -> Any:
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        method, url, headers, body, post = await self._client.param_serialize(
            method,
            path,
            query_params=params,
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        return await self._client.call_api(
            method, url, headers, body, post, _request_timeout=request_timeout or self._timeout
        )

    async def watch(
        self,
        path: str,
        resource_version: str,
        timeout_seconds: int,
        opened: Callable[[], None] | None = None,
    ) -> AsyncIterator[Json]:
        """Watch events ({type, object}) from `resource_version` until the server ends the stream;
        `opened` is called once the server has accepted the watch (a quiet watch is still a watch)."""
        query = {
            "watch": "1",
            "resourceVersion": resource_version,
            "timeoutSeconds": timeout_seconds,
            "allowWatchBookmarks": "true",
        }
        await self.limiter.acquire()
        response = await self._send("GET", path, query, None, "application/json", timeout_seconds + 30)
        try:
            if response.status != 200:
                data = await response.read()
                raise KubeError(response.status, response.reason or "", data.decode("utf-8", "replace"))
            if opened is not None:
                opened()
            content: aiohttp.StreamReader = response.response.content
            while True:
                line = await content.readline()
                if not line:
                    return
                if line.strip():
                    yield json.loads(line)
        finally:
            response.response.release()

    # -- nodes ------------------------------------------------------------------------------------

    async def get_node(self, name: str) -> Json:
        return await self.request("GET", f"{NODES}/{_q(name)}")

    async def find_node(self, name: str) -> Json | None:
        try:
            return await self.get_node(name)
        except KubeError as err:
            if err.status == 404:
                return None
            raise

    async def list_nodes(
        self, label_selector: str | None = None, limit: int | None = None, continue_token: str | None = None
    ) -> Json:
        """One listing of Nodes, or with `limit` one page of it (`metadata.continue` names the next)."""
        query = {"labelSelector": label_selector, "limit": limit, "continue": continue_token}
        return await self.request("GET", NODES, query=query)

    async def update_node(
        self, name: str, mutate: Callable[[Json], bool], attempts: int = 8, current: Json | None = None
    ) -> Json:
        """Read-modify-write with the resourceVersion: `mutate` edits the node in place and says whether
        it changed anything (nothing to write when it did not). A conflict re-reads and tries again.
        `current`: the node as the caller read it (the informer cache: it is copied, never changed),
        written on its resourceVersion without a read first; a conflict reads the server's, and so
        does "nothing to change" on it (a stale copy must not decide that alone)."""
        cached = current
        for attempt in range(attempts):
            node = copy.deepcopy(cached) if cached else await self.get_node(name)
            if not mutate(node):
                if cached:
                    cached = None
                    continue
                return node
            from_cache, cached = cached is not None, None
            try:
                return await self.request("PUT", f"{NODES}/{_q(name)}", body=node)
            except KubeError as err:
                if err.status != 409 or attempt == attempts - 1:
                    raise
            if not from_cache:  # a cached copy that lagged is no contention: read again at once
                await asyncio.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
        raise AssertionError("unreachable")

    async def delete_node(self, name: str, uid: str | None = None) -> None:
        """Delete the node; with `uid`, only if the name is still that node (else the API server
        answers 409 Conflict)."""
        body: Json = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if uid:
            body["preconditions"] = {"uid": uid}
        await self.request("DELETE", f"{NODES}/{_q(name)}", body=body)

    # -- pods -------------------------------------------------------------------------------------

    async def pods_on_node(self, node: str) -> list[Json]:
        result = await self.request("GET", PODS, query={"fieldSelector": f"spec.nodeName={node}"})
        return list(result.get("items") or [])

    async def evict(self, pod: Json) -> None:
        meta = pod["metadata"]
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "deleteOptions": {"preconditions": {"uid": meta["uid"]}},
        }
        path = f"/api/v1/namespaces/{_q(meta['namespace'])}/pods/{_q(meta['name'])}/eviction"
        # A PDB's refusal is a 429 with Retry-After: 10; the drain backs off per budget instead.
        await self.request("POST", path, body=body, retry_throttled=False)

    async def delete_pod(self, pod: Json, grace_period_seconds: int) -> None:
        meta = pod["metadata"]
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": grace_period_seconds,
            "preconditions": {"uid": meta["uid"]},
        }
        path = f"/api/v1/namespaces/{_q(meta['namespace'])}/pods/{_q(meta['name'])}"
        await self.request("DELETE", path, body=body)

    async def pdbs(self, namespace: str) -> list[Json]:
        result = await self.request("GET", f"/apis/policy/v1/namespaces/{_q(namespace)}/poddisruptionbudgets")
        return list(result.get("items") or [])

    async def pvc(self, namespace: str, name: str) -> Json | None:
        try:
            return await self.request(
                "GET", f"/api/v1/namespaces/{_q(namespace)}/persistentvolumeclaims/{_q(name)}"
            )
        except KubeError as err:
            if err.status == 404:
                return None
            raise

    async def volume_attachments(self) -> list[Json]:
        result = await self.request("GET", VOLUME_ATTACHMENTS)
        return list(result.get("items") or [])

    # -- custom resources -------------------------------------------------------------------------

    async def get_cluster_custom(self, group: str, version: str, plural: str, name: str) -> Json:
        return await self.request("GET", f"/apis/{group}/{version}/{plural}/{_q(name)}")

    async def list_cluster_custom(self, group: str, version: str, plural: str) -> list[Json]:
        """Every object of a cluster-scoped custom kind; none when the kind is not served (its CRD is
        not installed: e.g. karpflow's operator controls on a cluster that never applied deploy/crds)."""
        try:
            result = await self.request("GET", f"/apis/{group}/{version}/{plural}")
        except KubeError as err:
            if err.status == 404:
                return []
            raise
        return list(result.get("items") or [])

    async def replace_cluster_custom_status(
        self, group: str, version: str, plural: str, name: str, body: Json
    ) -> Json:
        """PUT the status subresource; `body` carries the resourceVersion it replaces (409 if stale)."""
        return await self.request("PUT", f"/apis/{group}/{version}/{plural}/{_q(name)}/status", body=body)
