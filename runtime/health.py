"""The worker's HTTP endpoint for Kubernetes probes and Prometheus: /healthz (liveness: the event
loop answers; a stuck loop fails the probe and the pod restarts), /readyz (readiness: what the
worker says, and why not when it is not) and /metrics (runtime/metrics.py: karpflow's series,
Karpenter's names where the meaning is the same, and the Temporal SDK's)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from aiohttp import web

from runtime import metrics

SDK_DRAIN_INTERVAL = 1.0  # seconds between moves of the Temporal SDK's buffered metrics


class HealthServer:
    def __init__(
        self,
        host: str,
        port: int,
        ready: Callable[[], bool],
        serve_metrics: bool = True,
        reasons: Callable[[], list[str]] | None = None,
    ) -> None:
        """`reasons`: why the worker is not ready, shown by /readyz when it is not."""
        self.host = host
        self.requested_port = port
        self.ready = ready
        self.reasons = reasons
        self.serve_metrics = serve_metrics
        self.port: int | None = None
        self._runner: web.AppRunner | None = None
        self._drain: asyncio.Task[None] | None = None

    async def start(self) -> None:
        app = web.Application()
        app.add_routes([web.get("/healthz", self._healthz), web.get("/readyz", self._readyz)])
        if self.serve_metrics:
            app.add_routes([web.get("/metrics", self._metrics)])
            self._drain = asyncio.create_task(self._drain_sdk_metrics(), name="sdk-metrics-drain")
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.requested_port)
        await site.start()
        self._runner = runner
        # aiohttp types its server as asyncio.AbstractServer; the loop's create_server made an
        # asyncio.Server, which has the sockets.
        server = site._server
        sockets = server.sockets if isinstance(server, asyncio.Server) else []
        self.port = sockets[0].getsockname()[1] if sockets else self.requested_port

    async def stop(self) -> None:
        if self._drain is not None:
            self._drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._drain
            self._drain = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, _: web.Request) -> web.Response:
        ok = self.ready()
        body: dict[str, object] = {"ready": ok}
        if not ok and self.reasons is not None:
            body["reasons"] = self.reasons()
        return web.json_response(body, status=200 if ok else 503)

    async def _metrics(self, _: web.Request) -> web.Response:
        body, content_type = metrics.exposition()
        response = web.Response(body=body)
        response.headers["Content-Type"] = content_type  # carries `version=0.0.4`, which aiohttp's
        return response  # content_type argument would refuse as a parameter

    async def _drain_sdk_metrics(self) -> None:
        # The SDK's buffer is bounded: between two scrapes it must not fill up and drop updates.
        while True:
            await asyncio.sleep(SDK_DRAIN_INTERVAL)
            metrics.drain_temporal_metrics()
