"""The HTTP face of the store: Kubernetes REST (JSON) on aiohttp, plus `/sim/...` controls.

Routing is by hand, the way kube-apiserver reads a path: `/api/v1/...` or `/apis/G/V/...`, then
`namespaces/NS/PLURAL[/NAME[/SUB]]` when PLURAL is a namespaced resource of that group version,
else `PLURAL[/NAME[/SUB]]` (so `/api/v1/namespaces/x/status` is the namespace's status). The verb
is the Kubernetes verb (get, list, watch, create, update, patch, delete, deletecollection), which
is also what fault rules and the request log use.

Responses: 201 on create (and on eviction / binding, with a Success Status), typed `XList` with
`metadata.resourceVersion` (and `continue`, `remainingItemCount` with `limit`), server-side Tables
when kubectl asks for them, watch as a stream of JSON lines with bookmarks, and every error as a
`Status` object with its code and reason. A body that is not JSON, or of the wrong kind, is a 400;
protobuf bodies (but kubectl's TokenRequest, protobuf_wire.py) and server-side apply are 415.
Discovery and OpenAPI are served as kubectl asks for them: OpenAPI v3 per group-version, v2 as
JSON or as gnostic protobuf (openapi_protobuf.py). In secure mode (security.py) every request is
authenticated, then authorized, then routed.

Everything outside the Kubernetes URL space lives under `/sim/`:
  GET  /sim/state            every object (the store's dump); POST /sim/state loads one, or
                             objects as NDJSON (Content-Type: application/x-ndjson, one per line)
  POST /sim/reset            empty the store (initial namespaces only), clear faults and the log
  GET|POST|DELETE /sim/faults, DELETE /sim/faults/{id}     fault rules (see faults.py)
  GET|DELETE /sim/requests   the request log (?verb=&resource=&namespace=&name=&status=&since=&limit=)
  GET|PUT /sim/timescale     {"factor": float}: how fast simulated delays (grace periods) run
  GET|DELETE /sim/api-stats  requests and response bytes by user, verb and resource (api_stats.py)
  GET|PUT|DELETE /sim/flowcontrol   the per-user share of the server (flowcontrol.py); off by default

`/metrics` is kube-apiserver's (metrics.py): its request and response-size series and the emulator's
per-user ones (the admin's in secure mode, as kube-apiserver gives it to system:monitoring).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any

import orjson
import yaml
from aiohttp import web

from sim.apiserver import crds, discovery, metrics, openapi, openapi_protobuf, protobuf_wire, tables
from sim.apiserver.api_stats import ApiStats, StatsKey
from sim.apiserver.errors import (
    ApiError,
    BadRequest,
    Forbidden,
    Gone,
    InternalError,
    MethodNotAllowed,
    NotFound,
    Timeout,
    UnsupportedMediaType,
    error_for_code,
)
from sim.apiserver.faults import FaultRule, Faults, RequestLog
from sim.apiserver.flowcontrol import TOO_MANY_REQUESTS, FlowControl, FlowControlConfig, seats
from sim.apiserver.patching import APPLY_PATCH, PATCH_TYPES
from sim.apiserver.resources import ResourceType, by_gvr, clear_registered
from sim.apiserver.security import ANONYMOUS, Authorizer, Tokens, User, non_resource_allowed
from sim.apiserver.security import Request as RbacRequest
from sim.apiserver.store import Store

log = logging.getLogger(__name__)

JSON = "application/json"
_PATCH_TYPES = {content_type: short for short, content_type in PATCH_TYPES.items()}


@dataclass
class Target:
    """What a Kubernetes resource URL names."""

    rt: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None

    @property
    def resource(self) -> str:
        return f"{self.rt.plural}/{self.subresource}" if self.subresource else self.rt.plural


def parse_path(path: str) -> Target | None:
    """Target for `/api/...` and `/apis/...` resource paths; None for discovery documents."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 2:
        group, version, rest = "", parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    if not rest:
        return None
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        candidate = by_gvr(group, version, rest[2])
        if candidate is not None and candidate.namespaced:
            namespace, rest = rest[1], rest[2:]
    rt = by_gvr(group, version, rest[0])
    if rt is None or len(rest) > 3:
        raise NotFound("the server could not find the requested resource")
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else None
    if name is not None and rt.namespaced and namespace is None:
        raise NotFound("the server could not find the requested resource")
    if sub is not None and sub not in rt.subresources:
        raise NotFound(f"the server could not find the requested resource ({rt.plural}/{sub})")
    return Target(rt, namespace, name, sub)


def _verb(method: str, target: Target, query: Any) -> str:
    if method == "GET":
        if target.name is None:
            return "watch" if query.get("watch") in ("true", "1") else "list"
        return "get"
    if method == "POST":
        return "create"
    if method == "PUT":
        return "update"
    if method == "PATCH":
        return "patch"
    if method == "DELETE":
        return "deletecollection" if target.name is None else "delete"
    return method.lower()


def _json(data: Any, status: int = 200, content_type: str = JSON) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, headers={"Content-Type": content_type})


def _raw(body: bytes, status: int = 200) -> web.Response:
    return web.Response(body=body, status=status, headers={"Content-Type": JSON})


def _error(err: ApiError) -> web.Response:
    headers = {"Content-Type": JSON}
    if err.retry_after:
        headers["Retry-After"] = str(err.retry_after)
    return web.Response(body=orjson.dumps(err.status()), status=err.code, headers=headers)


class _Rejected(Exception):
    """Flow control turned the request away (answered before any other handling)."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(retry_after)
        self.retry_after = retry_after


def _too_many_requests(retry_after: int) -> web.Response:
    """kube-apiserver's answer when flow control rejects a request: plain text, not a Status."""
    return web.Response(
        text=TOO_MANY_REQUESTS,
        status=429,
        headers={"Retry-After": str(retry_after), "Content-Type": "text/plain; charset=utf-8"},
    )


def _body_length(response: web.StreamResponse) -> int:
    body = response.body if isinstance(response, web.Response) else None
    return len(body) if isinstance(body, bytes | bytearray) else 0


def _is_full_list(verb: str | None, target: Target | None, query: Any) -> bool:
    """A list that reads every object of its kind: cluster-wide, no selector, its first page."""
    return (
        verb == "list"
        and target is not None
        and target.namespace is None
        and not query.get("labelSelector")
        and not query.get("fieldSelector")
        and not query.get("continue")
    )


def _int_param(query: Any, name: str) -> int | None:
    value = query.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise BadRequest(f"invalid value for {name}: {value!r}") from None


class ApiServer:
    """Builds the aiohttp application over a store. See the module docstring for the routes."""

    def __init__(
        self,
        store: Store,
        *,
        faults: Faults | None = None,
        request_log: RequestLog | None = None,
        bookmark_interval: float = 10.0,
        max_watch_seconds: float = 1800.0,
        tokens: Tokens | None = None,
        stats: ApiStats | None = None,
        flow_control: FlowControlConfig | None = None,
    ) -> None:
        self.store = store
        # Secure mode (sim/apiserver/security.py): every request authenticated and authorized.
        self.tokens = tokens
        self.authorizer = Authorizer(store) if tokens is not None else None
        self.issuer = tokens or Tokens()  # TokenRequest works either way; only secure mode checks
        self.faults = faults or Faults()
        self.requests = request_log or RequestLog()
        self.stats = stats or ApiStats()
        self.flow_control = FlowControl(flow_control)
        self.bookmark_interval = bookmark_interval
        self.max_watch_seconds = max_watch_seconds
        self.server_address = "127.0.0.1:6443"
        # Kinds registered from CRDs are module state: a new server serves its own store's CRDs only.
        clear_registered()
        crds.sync(store)

    def app(self) -> web.Application:
        # /sim/state loads whole clusters (100k pods is ~200 MB of JSON).
        app = web.Application(client_max_size=1024 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    # --- entry point ---------------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path.startswith("/sim/") or path == "/sim":
            try:
                return await self._sim(request)
            except ApiError as err:
                return _error(err)
        started = time.perf_counter()
        target: Target | None = None
        verb: str | None = None
        fault = False
        user: User | None = None
        # Who is asking, for the counts and flow control: in secure mode whom authentication finds;
        # otherwise the ServiceAccount of a token the TokenRequest API issued, else anonymous.
        caller = self.issuer.identify(request.headers.get("Authorization")) or ANONYMOUS
        try:
            # kube-apiserver authenticates before it routes: an unserved resource is a 404 for a
            # known caller, a 401 for anyone else.
            user = self.tokens.authenticate(request.headers.get("Authorization")) if self.tokens else None
            target = parse_path(path)
            if target is None:
                if user is not None and not non_resource_allowed(user, path):
                    raise Forbidden(f'forbidden: User "{user.name}" cannot get path "{path}"')
                response = await self._non_resource(request)
            else:
                verb = _verb(request.method, target, request.query)
                # Flow control comes after authentication and before authorization, as in
                # kube-apiserver's handler chain (server/config.go DefaultBuildHandlerChain).
                cost = seats(
                    verb,
                    self.store.count(target.rt) if verb in ("list", "watch") else 0,
                    request.query.get("sendInitialEvents") == "true",
                )
                retry_after = self.flow_control.admit(caller.name, caller.groups, cost)
                if retry_after is not None:
                    raise _Rejected(retry_after)
                if user is not None and self.authorizer is not None:
                    rt = target.rt
                    asked = RbacRequest(
                        verb, rt.group, rt.plural, target.subresource, target.namespace, target.name
                    )
                    self.authorizer.check(user, asked)
                rewatch = verb == "watch" and request.query.get("resourceVersion") not in (None, "", "0")
                decision = self.faults.decide(verb, target.resource, target.namespace, target.name, rewatch)
                fault = bool(decision.status or decision.hang_s or decision.latency_s)
                if decision.latency_s:
                    await asyncio.sleep(decision.latency_s)
                if decision.hang_s is not None:
                    await asyncio.sleep(decision.hang_s)
                    raise Timeout(
                        "Timeout: request did not complete within requested timeout - context deadline "
                        "exceeded (injected)",
                        retry_after=1,
                    )
                if decision.status == Gone.code and verb == "watch":
                    response = await self._expired_watch(request)
                elif decision.status:
                    raise error_for_code(
                        decision.status,
                        decision.message or f"injected fault ({decision.status})",
                        retry_after=1 if decision.status == 429 else None,
                    )
                else:
                    response = await self._resource(
                        request, target, verb, decision, StatsKey(caller.name, verb, target.resource)
                    )
                if (
                    target.rt.plural == crds.CRDS
                    and verb not in ("get", "list", "watch")
                    and response.status < 300
                ):
                    crds.sync(self.store)
        except _Rejected as rejected:
            response = _too_many_requests(rejected.retry_after)
        except ApiError as err:
            response = _error(err)
        except ConnectionResetError:  # the client went away (a killed worker): nothing to answer
            log.debug("client gone during %s %s", request.method, request.path_qs)
            response = web.Response(status=499)
        except Exception as err:  # never let a handler bug become a dropped connection
            log.exception("emulator handler failed on %s %s", request.method, request.path_qs)
            response = _error(InternalError(f"emulator error: {err!r}"))
        self.requests.record(
            method=request.method,
            path=path,
            query=request.query_string,
            verb=verb,
            resource=target.resource if target else None,
            namespace=target.namespace if target else None,
            name=target.name if target else None,
            status=response.status,
            duration_ms=(time.perf_counter() - started) * 1000,
            user_agent=request.headers.get("User-Agent"),
            fault=fault,
            user=user.name if user is not None else None,
        )
        key = StatsKey(
            caller.name,
            verb or request.method.lower(),
            target.resource if target else "/" + (path.split("/")[1] if "/" in path else path),
        )
        self.stats.record(
            key, response.status, _body_length(response), full_list=_is_full_list(verb, target, request.query)
        )
        return response

    # --- discovery and health ------------------------------------------------------------------------

    async def _non_resource(self, request: web.Request) -> web.Response:
        if request.method not in ("GET", "HEAD"):
            raise MethodNotAllowed(
                f"the server does not allow this method on the requested resource ({request.path})"
            )
        path = request.path.rstrip("/") or "/"
        accept = request.headers.get("Accept", "")
        if path in ("/healthz", "/readyz", "/livez") or path.startswith(("/healthz/", "/readyz/", "/livez/")):
            return web.Response(text="ok", content_type="text/plain")
        if path == "/version":
            return _json(discovery.VERSION_INFO)
        if path == "/metrics":
            return web.Response(
                body=metrics.exposition(self.stats), headers={"Content-Type": metrics.CONTENT_TYPE}
            )
        if path == "/api":
            if discovery.wants_aggregated(accept):
                return _json(discovery.aggregated(core=True), content_type=discovery.AGGREGATED_CONTENT_TYPE)
            return _json(discovery.api_versions(self.server_address))
        if path == "/apis":
            if discovery.wants_aggregated(accept):
                return _json(discovery.aggregated(core=False), content_type=discovery.AGGREGATED_CONTENT_TYPE)
            return _json(discovery.api_group_list())
        parts = [p for p in path.split("/") if p]
        if parts[0] == "api" and len(parts) == 2:
            doc = discovery.resource_list("", parts[1])
        elif parts[0] == "apis" and len(parts) == 2:
            doc = discovery.api_group(parts[1])
        elif parts[0] == "apis" and len(parts) == 3:
            doc = discovery.resource_list(parts[1], parts[2])
        elif path == "/openapi/v2":
            if "protobuf" in accept:  # kubectl asks for gnostic's protobuf first
                return web.Response(
                    body=openapi_protobuf.document(openapi.v2()), content_type=openapi_protobuf.CONTENT_TYPE
                )
            doc = openapi.v2()
        elif path == "/openapi/v3":
            doc = openapi.v3_root()
        elif path.startswith("/openapi/v3/"):
            doc = openapi.v3_document(path[len("/openapi/v3/") :])
        else:
            doc = None
        if doc is None:
            raise NotFound("the server could not find the requested resource")
        return _json(doc)

    # --- resources -----------------------------------------------------------------------------------

    async def _resource(
        self, request: web.Request, target: Target, verb: str, decision: Any, key: StatsKey
    ) -> web.StreamResponse:
        q = request.query
        store = self.store
        rt, ns, name, sub = target.rt, target.namespace, target.name, target.subresource
        dry_run = q.get("dryRun") == "All"
        if verb == "watch":
            return await self._watch(request, target, decision, key)
        if verb == "list":
            return self._list(request, target)
        if verb == "get":
            raw = store.get_raw(rt, name, ns)  # type: ignore[arg-type]
            if tables.wants_table(request.headers.get("Accept", "")):
                obj = orjson.loads(raw)
                return _json(
                    tables.table(
                        rt,
                        [obj],
                        resource_version=obj["metadata"]["resourceVersion"],
                        include_object=q.get("includeObject", "PartialObjectMetadata"),
                    )
                )
            return _raw(raw)
        if verb == "create":
            body = await self._body(request, token_request=sub == "token")
            if sub == "eviction":
                return _json(self._evict(ns, name, body, dry_run), status=201)  # type: ignore[arg-type]
            if sub == "binding":
                return _json(self._bind(ns, name, body), status=201)  # type: ignore[arg-type]
            if sub == "token":
                return _json(self._token_request(ns, name, body), status=201)  # type: ignore[arg-type]
            if name is not None:
                raise MethodNotAllowed(f"POST is not supported on {target.resource} objects")
            return _raw(store.create(rt, body, ns, dry_run=dry_run, copy=False, raw=True), status=201)
        if verb == "update":
            body = await self._body(request)
            if sub not in (None, "status"):
                raise MethodNotAllowed(f"PUT is not supported on {target.resource}")
            if name is None:
                raise MethodNotAllowed("PUT is not supported on a collection")
            if (body.get("metadata") or {}).get("name") not in (None, name):
                raise BadRequest("the name of the object does not match the name on the URL")
            if sub == "status":
                return _raw(store.update_status(rt, body, ns, dry_run=dry_run, copy=False, raw=True))
            return _raw(store.update(rt, body, ns, dry_run=dry_run, copy=False, raw=True))
        if verb == "patch":
            if name is None or sub not in (None, "status"):
                raise MethodNotAllowed(f"PATCH is not supported on {target.resource}")
            content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
            patch_type = _PATCH_TYPES.get(content_type)
            if patch_type is None:
                accepted = ", ".join(_PATCH_TYPES)
                what = (
                    "server-side apply is not supported by the emulator; "
                    if content_type == APPLY_PATCH
                    else ""
                )
                raise UnsupportedMediaType(
                    f"{what}the body of the request was in an unknown format - accepted "
                    f"media types include: {accepted}"
                )
            patch = self._parse(await request.read(), JSON)
            return _raw(
                store.patch(
                    rt, name, patch, ns, patch_type=patch_type, subresource=sub, dry_run=dry_run, raw=True
                )
            )
        if verb == "delete":
            if sub is not None:
                raise MethodNotAllowed(f"DELETE is not supported on {target.resource}")
            return await self._delete(request, target, dry_run)
        if verb == "deletecollection":
            opts = await self._delete_options(request)
            deleted = store.delete_collection(
                rt,
                ns,
                label_selector=q.get("labelSelector"),
                field_selector=q.get("fieldSelector"),
                grace_period_seconds=opts["grace"],
                propagation_policy=opts["propagation"],
            )
            return _json(self._list_doc(rt, deleted, str(store.resource_version)))
        raise MethodNotAllowed(f"the server does not allow this method on the requested resource ({verb})")

    def _list(self, request: web.Request, target: Target) -> web.Response:
        q = request.query
        rt = target.rt
        result = self.store.list_raw(
            rt,
            target.namespace,
            label_selector=q.get("labelSelector"),
            field_selector=q.get("fieldSelector"),
            limit=_int_param(q, "limit"),
            continue_token=q.get("continue") or None,
        )
        if tables.wants_table(request.headers.get("Accept", "")):
            objects = [orjson.loads(b) for b in result.items]
            return _json(
                tables.table(
                    rt,
                    objects,
                    resource_version=result.resource_version,
                    continue_token=result.continue_token,
                    remaining=result.remaining_item_count,
                    include_object=q.get("includeObject", "PartialObjectMetadata"),
                )
            )
        meta: dict[str, Any] = {"resourceVersion": result.resource_version}
        if result.continue_token:
            meta["continue"] = result.continue_token
        if result.remaining_item_count is not None:
            meta["remainingItemCount"] = result.remaining_item_count
        head = orjson.dumps({"kind": rt.list_kind, "apiVersion": rt.api_version, "metadata": meta})
        # Join the stored bytes: no parse, no re-serialization of the items.
        body = b"".join((head[:-1], b',"items":[', b",".join(result.items), b"]}"))
        return _raw(body)

    @staticmethod
    def _list_doc(rt: ResourceType, items: list[dict[str, Any]], rv: str) -> dict[str, Any]:
        return {
            "kind": rt.list_kind,
            "apiVersion": rt.api_version,
            "metadata": {"resourceVersion": rv},
            "items": items,
        }

    async def _delete_options(self, request: web.Request) -> dict[str, Any]:
        q = request.query
        raw = await request.read()
        body: dict[str, Any] = {}
        if raw.strip():
            body = self._parse(raw, request.headers.get("Content-Type", JSON))
            if not isinstance(body, dict) or body.get("kind") not in (None, "DeleteOptions"):
                raise BadRequest("the body of a DELETE must be a DeleteOptions object")
        grace = body.get("gracePeriodSeconds")
        if grace is None:
            grace = _int_param(q, "gracePeriodSeconds")
        propagation = body.get("propagationPolicy") or q.get("propagationPolicy")
        orphan = body.get("orphanDependents")
        if orphan is None and q.get("orphanDependents") in ("true", "false"):
            orphan = q.get("orphanDependents") == "true"
        if propagation is None and orphan is not None:
            propagation = "Orphan" if orphan else "Background"
        dry = body.get("dryRun") or q.getall("dryRun", [])
        return {
            "grace": grace,
            "propagation": propagation,
            "preconditions": body.get("preconditions"),
            "dry_run": "All" in dry,
        }

    async def _delete(self, request: web.Request, target: Target, dry_run: bool) -> web.Response:
        opts = await self._delete_options(request)
        rt, ns, name = target.rt, target.namespace, target.name
        assert name is not None
        obj = self.store.delete(
            rt,
            name,
            ns,
            grace_period_seconds=opts["grace"],
            preconditions=opts["preconditions"],
            propagation_policy=opts["propagation"],
            dry_run=dry_run or opts["dry_run"],
        )
        if obj["metadata"].get("deletionTimestamp") or rt.kind == "Pod":
            return _json(obj)  # still there (finalizers, grace period), or pods: the deleted object
        details = {"name": name, "kind": rt.plural, "uid": obj["metadata"].get("uid")}
        if rt.group:
            details["group"] = rt.group
        return _json(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}
        )

    def _evict(self, ns: str, name: str, body: dict[str, Any], dry_run: bool) -> dict[str, Any]:
        if body.get("kind") not in (None, "Eviction") or body.get("apiVersion") not in (
            None,
            "policy/v1",
            "policy/v1beta1",
        ):
            raise BadRequest(f"not a Eviction object: {body.get('apiVersion')}/{body.get('kind')}")
        if (body.get("metadata") or {}).get("name") not in (None, name):
            raise BadRequest("name in URL does not match name in Eviction object")
        options = body.get("deleteOptions") or {}
        return self.store.evict(
            ns,
            name,
            preconditions=options.get("preconditions"),
            grace_period_seconds=options.get("gracePeriodSeconds"),
            dry_run=dry_run or "All" in (options.get("dryRun") or []),
        )

    def _token_request(self, ns: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """TokenRequest: a token that authenticates as the ServiceAccount (which must exist)."""
        self.store.get("serviceaccounts", name, ns)  # NotFound, as kube-apiserver answers
        seconds = int((body.get("spec") or {}).get("expirationSeconds") or 3600)
        if seconds < 600:
            raise BadRequest(
                "spec.expirationSeconds: Invalid value: may not specify a duration less than 10 minutes"
            )
        token, expires = self.issuer.issue(ns, name, seconds)
        return {
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": name, "namespace": ns, "creationTimestamp": None},
            "spec": {
                "audiences": (body.get("spec") or {}).get("audiences") or [],
                "expirationSeconds": seconds,
            },
            "status": {"token": token, "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ")},
        }

    def _bind(self, ns: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("kind") not in (None, "Binding"):
            raise BadRequest(f"not a Binding object: {body.get('kind')}")
        if (body.get("metadata") or {}).get("name") not in (None, name):
            raise BadRequest("name in URL does not match name in Binding object")
        self.store.bind(ns, name, str((body.get("target") or {}).get("name") or ""))
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    async def _body(self, request: web.Request, *, token_request: bool = False) -> dict[str, Any]:
        """The request's object; a TokenRequest may come as protobuf (`kubectl create token`)."""
        content_type = request.headers.get("Content-Type", JSON)
        if token_request and "protobuf" in content_type:
            try:
                return protobuf_wire.token_request(await request.read())
            except protobuf_wire.WireError as err:
                raise BadRequest(f"the TokenRequest body could not be decoded: {err}") from None
        body = self._parse(await request.read(), content_type)
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        return body

    @staticmethod
    def _parse(raw: bytes, content_type: str) -> Any:
        media = content_type.split(";")[0].strip().lower()
        if "protobuf" in media:
            raise UnsupportedMediaType(
                f"the body of the request was in an unknown format - {media} is not supported "
                "by the emulator; use application/json"
            )
        if not raw.strip():
            raise BadRequest("the request body is empty")
        try:
            if media in ("application/yaml", "application/x-yaml", "text/yaml"):
                return yaml.safe_load(raw)
            return orjson.loads(raw)
        except (orjson.JSONDecodeError, yaml.YAMLError) as err:
            raise BadRequest(f"the request body is not valid JSON: {err}") from None

    # --- watch ---------------------------------------------------------------------------------------

    @staticmethod
    async def _expired_watch(request: web.Request) -> web.StreamResponse:
        """An injected 410 on a watch, as the watch cache gives it: 200, then one ERROR event."""
        resp = web.StreamResponse(status=200, headers={"Content-Type": JSON, "Cache-Control": "no-cache"})
        await resp.prepare(request)
        gone = Gone("too old resource version (injected)")
        await resp.write(orjson.dumps({"type": "ERROR", "object": gone.status()}) + b"\n")
        return resp

    async def _watch(
        self, request: web.Request, target: Target, decision: Any, key: StatsKey
    ) -> web.StreamResponse:
        q = request.query
        rt = target.rt
        since = q.get("resourceVersion") or None
        initial = since in (None, "0")
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        send_initial_end = bookmarks and q.get("sendInitialEvents") == "true"
        timeout = float(_int_param(q, "timeoutSeconds") or self.max_watch_seconds)
        as_table = tables.wants_table(request.headers.get("Accept", ""))
        include = q.get("includeObject", "PartialObjectMetadata")
        resp = web.StreamResponse(status=200, headers={"Content-Type": JSON, "Cache-Control": "no-cache"})
        resp.enable_chunked_encoding()
        stats = self.stats

        async def send(data: bytes) -> None:
            # Counted as written: a watch lives for minutes, its bytes are this second's load.
            await resp.write(data)
            stats.add_bytes(key, len(data))

        try:
            sub = self.store.subscribe(
                rt,
                target.namespace,
                since=None if initial else since,
                initial=initial,
                label_selector=q.get("labelSelector"),
                field_selector=q.get("fieldSelector"),
            )
        except Gone as err:
            # Like the watch cache: 200, then one ERROR event carrying the 410 Status.
            await resp.prepare(request)
            await send(orjson.dumps({"type": "ERROR", "object": err.status()}) + b"\n")
            return resp
        initial_left = sub.queued()
        initial_rv = self.store.resource_version
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if decision.disconnect_after_seconds is not None:
            deadline = min(deadline, loop.time() + decision.disconnect_after_seconds)
        next_bookmark = loop.time() + self.bookmark_interval
        sent = 0
        await resp.prepare(request)
        try:
            if send_initial_end and initial_left == 0:
                await send(self._bookmark(rt, initial_rv, initial_end=True))
                send_initial_end = False
            while True:
                now = loop.time()
                if now >= deadline:
                    break
                wake = min(deadline, next_bookmark) if bookmarks else deadline
                event = await sub.get(max(0.0, wake - now))
                if event is None:
                    if sub.closed:
                        if sub.error is not None:
                            await send(orjson.dumps({"type": "ERROR", "object": sub.error.status()}) + b"\n")
                        break
                    if bookmarks and loop.time() >= next_bookmark:
                        rv = sub.bookmark_version()
                        if rv is not None:
                            await send(self._bookmark(rt, rv))
                        next_bookmark = loop.time() + self.bookmark_interval
                    continue
                if as_table:
                    obj = tables.table(
                        rt,
                        [event.object],
                        resource_version=str(event.resource_version),
                        include_object=include,
                    )
                    line = orjson.dumps({"type": event.type, "object": obj}) + b"\n"
                else:
                    line = b"".join((b'{"type":"', event.type.encode(), b'","object":', event.raw, b"}\n"))
                await send(line)
                sent += 1
                if send_initial_end:
                    initial_left -= 1
                    if initial_left == 0:
                        await send(self._bookmark(rt, initial_rv, initial_end=True))
                        send_initial_end = False
                if decision.disconnect_after_events is not None and sent >= decision.disconnect_after_events:
                    break
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            sub.close()
        return resp

    @staticmethod
    def _bookmark(rt: ResourceType, rv: int, *, initial_end: bool = False) -> bytes:
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        obj = {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta}
        return orjson.dumps({"type": "BOOKMARK", "object": obj}) + b"\n"

    # --- /sim ----------------------------------------------------------------------------------------

    async def _sim(self, request: web.Request) -> web.Response:
        parts = [p for p in request.path.split("/") if p][1:]
        method = request.method
        what = parts[0] if parts else ""
        if what == "state" and method == "GET":
            return _json(self.store.dump())
        if what == "state" and method in ("POST", "PUT"):
            body = await request.read()
            if request.headers.get("Content-Type", "").startswith("application/x-ndjson"):
                # One object per line, parsed one at a time: a 100k-pod cluster loads without
                # ever holding its whole parse tree.
                count = self.store.load_objects(
                    orjson.loads(line) for line in body.splitlines() if line.strip()
                )
            else:
                dump = self._parse(body, JSON)
                self.store.load(dump)
                count = sum(len(v) for v in (dump.get("objects") or {}).values())
            crds.sync(self.store)
            return _json({"resourceVersion": self.store.resource_version, "objects": count})
        if what == "reset" and method == "POST":
            self.store.reset()
            crds.sync(self.store)
            self.faults.clear()
            self.requests.clear()
            self.stats.clear()
            return _json({"resourceVersion": self.store.resource_version})
        if what == "faults":
            if method == "GET":
                return _json({"items": [r.model_dump() for r in self.faults.rules()]})
            if method == "POST":
                body = self._parse(await request.read(), JSON)
                try:
                    rule = self.faults.add(FaultRule.model_validate(body))
                except ValueError as err:
                    raise BadRequest(f"invalid fault rule: {err}") from None
                return _json(rule.model_dump(), status=201)
            if method == "DELETE" and len(parts) == 2:
                if not self.faults.remove(int(parts[1])):
                    raise NotFound(f"no fault rule {parts[1]}")
                return _json({"deleted": int(parts[1])})
            if method == "DELETE":
                self.faults.clear()
                return _json({"deleted": "all"})
        if what == "requests":
            if method == "GET":
                q = request.query
                records = self.requests.query(
                    verb=q.get("verb"),
                    resource=q.get("resource"),
                    namespace=q.get("namespace"),
                    name=q.get("name"),
                    status=_int_param(q, "status"),
                    since_seq=_int_param(q, "since"),
                    limit=_int_param(q, "limit"),
                )
                return _json({"items": [dataclasses.asdict(r) for r in records]})
            if method == "DELETE":
                self.requests.clear()
                return _json({"deleted": "all"})
        if what == "api-stats":
            if method == "GET":
                return _raw(self.stats.doc().model_dump_json().encode())
            if method == "DELETE":
                self.stats.clear()
                return _json({"deleted": "all"})
        if what == "flowcontrol":
            if method in ("PUT", "POST"):
                try:
                    self.flow_control.config = FlowControlConfig.model_validate_json(await request.read())
                except ValueError as err:
                    raise BadRequest(f"invalid flow control: {err}") from None
            elif method == "DELETE":
                self.flow_control.config = None
            if method in ("GET", "PUT", "POST", "DELETE"):
                config = self.flow_control.config
                return _json({"config": config.model_dump() if config is not None else None})
        if what == "timescale":
            if method == "GET":
                return _json({"factor": self.store.timescale.factor})
            if method in ("PUT", "POST"):
                body = self._parse(await request.read(), JSON)
                factor = float(body.get("factor", -1)) if isinstance(body, dict) else -1
                if factor < 0:
                    raise BadRequest('body must be {"factor": <number >= 0>}')
                self.store.timescale.factor = factor
                return _json({"factor": factor})
        raise NotFound(f"no emulator control at {request.method} {request.path}")
