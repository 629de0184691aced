"""Run the emulator: in a background thread (sync code, tests, kubectl) or in a running loop.

    with EmulatorServer() as srv:               # own thread and event loop, free port
        srv.url, srv.store, srv.faults, srv.requests, srv.stats
        srv.write_kubeconfig(path)              # for kubectl / kubernetes.config.load_kube_config
        srv.api_client()                        # a configured sync kubernetes.client.ApiClient
        srv.aio_api_client()                    # the same for kubernetes.aio
        srv.call(fn, *args)                     # run fn in the server's loop thread, return result

    srv = EmulatorServer(store=my_store)
    await srv.start()                           # inside an existing asyncio loop (dev stack)
    ...
    await srv.stop()

In-process controllers should run in the server's loop: with `start()` that is the caller's
loop; with the threaded form, submit coroutines with `srv.run_coroutine(coro)`. Direct store
calls from any thread are safe (the store is locked).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from sim.apiserver.api_stats import ApiStats
from sim.apiserver.faults import Faults, RequestLog
from sim.apiserver.flowcontrol import FlowControlConfig
from sim.apiserver.kubeconfig import write_kubeconfig
from sim.apiserver.security import Tls, Tokens
from sim.apiserver.server import ApiServer
from sim.apiserver.store import Store
from sim.timescale import TimeScale

T = TypeVar("T")


class EmulatorServer:
    def __init__(
        self,
        store: Store | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        timescale: TimeScale | None = None,
        faults: Faults | None = None,
        request_log: RequestLog | None = None,
        bookmark_interval: float = 10.0,
        secure_dir: Path | None = None,
        flow_control: FlowControlConfig | None = None,
    ) -> None:
        """`secure_dir`: serve HTTPS with a CA written there, and authenticate and authorize every
        request (sim/apiserver/security.py)."""
        self.store = store or Store(timescale or TimeScale(1.0))
        self.host = host
        self.port = port
        self.tls = Tls(secure_dir) if secure_dir is not None else None
        self.api = ApiServer(
            self.store,
            faults=faults,
            request_log=request_log,
            bookmark_interval=bookmark_interval,
            tokens=Tokens() if secure_dir is not None else None,
            flow_control=flow_control,
        )
        self._runner: web.ServerRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def faults(self) -> Faults:
        return self.api.faults

    @property
    def requests(self) -> RequestLog:
        return self.api.requests

    @property
    def stats(self) -> ApiStats:
        """Requests and bytes by user, verb and resource (api_stats.py)."""
        return self.api.stats

    @property
    def secure(self) -> bool:
        return self.tls is not None

    @property
    def url(self) -> str:
        return f"{'https' if self.secure else 'http'}://{self.host}:{self.port}"

    @property
    def admin_token(self) -> str:
        """The bearer token of `kubernetes-admin` (system:masters); any string when not secure."""
        return self.api.tokens.admin_token if self.api.tokens is not None else "emulator"

    def service_account_token(self, namespace: str, name: str) -> str:
        """A token for the ServiceAccount, as the TokenRequest API would give (it must exist)."""
        self.store.get("serviceaccounts", name, namespace)
        return self.api.issuer.issue(namespace, name)[0]

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("the emulator is not running")
        return self._loop

    # --- in an existing loop -------------------------------------------------------------------------

    async def start(self) -> EmulatorServer:
        """Serve in the running loop; returns when the port is bound (`self.port` is then real)."""
        self._loop = asyncio.get_running_loop()
        self.store.attach_loop(self._loop)
        loop = self._loop

        def make_request(
            message: Any, payload: Any, protocol: Any, writer: Any, task: Any
        ) -> web.BaseRequest:
            # /sim/state loads whole clusters (100k pods is ~200 MB of JSON).
            return web.BaseRequest(message, payload, protocol, writer, task, loop, client_max_size=1 << 30)

        # aiohttp's low-level server: the API does its own routing, so the Application machinery
        # (router, middlewares) would only add per-request cost.
        server = web.Server(self.api.handle, request_factory=make_request, access_log=None)
        # Watches are long-lived: do not let shutdown wait on them for the default minute.
        self._runner = web.ServerRunner(server, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            self.host,
            self.port,
            reuse_address=True,
            ssl_context=self.tls.server_context() if self.tls is not None else None,
        )
        await site.start()
        sockets = site._server.sockets if site._server else []  # type: ignore[union-attr]
        if sockets:
            self.port = sockets[0].getsockname()[1]
        self.api.server_address = f"{self.host}:{self.port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- in a background thread ----------------------------------------------------------------------

    def start_in_thread(self) -> EmulatorServer:
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start())
            except BaseException as err:
                ready.set_exception(err)
                loop.close()
                return
            ready.set_result(None)
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self.stop())
                pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
                for task in pending:
                    task.cancel()
                if pending:
                    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.close()

        self._thread = threading.Thread(target=run, name="k8s-emulator", daemon=True)
        self._thread.start()
        ready.result(timeout=30)
        return self

    def stop_thread(self) -> None:
        if self._thread is None:
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._thread = None

    def __enter__(self) -> EmulatorServer:
        return self.start_in_thread()

    def __exit__(self, *exc: object) -> None:
        self.stop_thread()

    def run_coroutine(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule a coroutine (a controller, say) on the server's loop from another thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` in the server's loop thread and return its result."""

        async def wrapper() -> T:
            return fn(*args)

        return self.run_coroutine(wrapper()).result(timeout=60)

    # --- clients -------------------------------------------------------------------------------------

    def write_kubeconfig(
        self, path: str | Path, *, namespace: str = "default", token: str | None = None
    ) -> Path:
        """A kubeconfig for the admin (or for `token`), with the CA in secure mode."""
        return write_kubeconfig(
            path,
            self.url,
            namespace=namespace,
            token=token or self.admin_token,
            ca_pem=self.tls.ca_pem if self.tls is not None else None,
        )

    def client_configuration(self, token: str | None = None) -> Any:
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = self.url
        cfg.api_key = {"authorization": f"Bearer {token or self.admin_token}"}
        if self.tls is not None:
            cfg.ssl_ca_cert = str(self.tls.ca_file)
        return cfg

    def api_client(self) -> Any:
        """A sync `kubernetes.client.ApiClient` for this emulator."""
        from kubernetes import client

        return client.ApiClient(self.client_configuration())

    def aio_api_client(self) -> Any:
        """A `kubernetes.aio.client.ApiClient` for this emulator (close it with `await .close()`)."""
        from kubernetes.aio import client

        cfg = client.Configuration(host=self.url, api_key={"authorization": f"Bearer {self.admin_token}"})
        if self.tls is not None:
            cfg.ssl_ca_cert = str(self.tls.ca_file)
        return client.ApiClient(cfg)
