"""The worker's health endpoint for Kubernetes probes: /healthz (liveness: the event loop answers; a
stuck loop fails the probe and the pod restarts) and /readyz (readiness: what the worker says)."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web


class HealthServer:
    def __init__(self, host: str, port: int, ready: Callable[[], bool]) -> None:
        self.host = host
        self.requested_port = port
        self.ready = ready
        self.port: int | None = None
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.add_routes([web.get("/healthz", self._healthz), web.get("/readyz", self._readyz)])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.requested_port)
        await site.start()
        self._runner = runner
        sockets = site._server.sockets if site._server else []  # type: ignore[union-attr]
        self.port = sockets[0].getsockname()[1] if sockets else self.requested_port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, _: web.Request) -> web.Response:
        ok = self.ready()
        return web.json_response({"ready": ok}, status=200 if ok else 503)
