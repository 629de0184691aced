"""`karpflow codec-server`: the Temporal Web UI (and `temporal --codec-endpoint`) read encrypted history
through it, with the same keys as the workers (runtime/payload_codec.py).

    karpflow codec-server --payload-key-file /etc/karpflow/payload-keys --port 8081 \\
        --cors-origin http://localhost:8233
    temporal server start-dev --ui-codec-endpoint http://127.0.0.1:8081      # or the UI's settings
    temporal workflow show --workflow-id ... --codec-endpoint http://127.0.0.1:8081

Temporal's remote codec protocol: `POST /decode` and `POST /encode` take and return
`{"payloads": [{"metadata": {...}, "data": "..."}]}` (the protobuf JSON of Payloads, bytes in base64).
The browser calls it from the UI's origin, so the answers carry CORS headers for the origins given
(`--cors-origin`, repeatable). It decrypts for whoever reaches it: bind it to localhost and reach it by
port-forward, or put it behind the same authentication as the UI (SECURITY.md).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import click
from aiohttp import web
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.converter import PayloadCodec

from runtime.payload_codec import DecryptError, EncryptionCodec, KeyFileError, load_keyring

log = logging.getLogger("karpflow.codec_server")
ALLOWED_HEADERS = "Content-Type, X-Namespace, Authorization"
DEFAULT_ORIGINS = ("http://localhost:8233", "http://127.0.0.1:8233")


def codec_app(codec: PayloadCodec, origins: Sequence[str]) -> web.Application:
    allowed = set(origins)

    def cors(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if origin and (origin in allowed or "*" in allowed):
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Allow-Credentials"] = "true"
            response.headers["Access-Control-Allow-Methods"] = "POST, OPTIONS"
            response.headers["Access-Control-Allow-Headers"] = ALLOWED_HEADERS
            response.headers["Vary"] = "Origin"
        return response

    def endpoint(
        apply: Callable[[Sequence[Payload]], Awaitable[list[Payload]]],
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                payloads = json_format.Parse(await request.text(), Payloads())
                result = Payloads(payloads=await apply(list(payloads.payloads)))
            except (json_format.ParseError, UnicodeDecodeError) as err:
                return cors(
                    request, web.json_response({"message": f"not a Payloads document: {err}"}, status=400)
                )
            except DecryptError as err:
                return cors(request, web.json_response({"message": str(err)}, status=400))
            return cors(request, web.json_response(json_format.MessageToDict(result)))

        return handle

    async def preflight(request: web.Request) -> web.StreamResponse:
        return cors(request, web.Response(status=204))

    async def healthz(request: web.Request) -> web.StreamResponse:
        return web.json_response({"status": "ok"})

    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.router.add_post("/decode", endpoint(codec.decode))
    app.router.add_post("/encode", endpoint(codec.encode))
    app.router.add_route("OPTIONS", "/decode", preflight)
    app.router.add_route("OPTIONS", "/encode", preflight)
    app.router.add_get("/healthz", healthz)
    return app


@click.command("codec-server")
@click.option(
    "--payload-key-file",
    envvar="KARPFLOW_PAYLOAD_KEY_FILE",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The workers' key file [env KARPFLOW_PAYLOAD_KEY_FILE].",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=8081, show_default=True)
@click.option(
    "--cors-origin",
    "origins",
    multiple=True,
    default=DEFAULT_ORIGINS,
    show_default=True,
    help="Origin of a Temporal Web UI allowed to call it (repeatable; '*' for any).",
)
def codec_server(payload_key_file: Path, host: str, port: int, origins: tuple[str, ...]) -> None:
    """Serve Temporal's remote codec (/decode, /encode) for the Web UI with the workers' keys."""
    try:
        keyring = load_keyring(payload_key_file)
    except KeyFileError as err:
        raise click.ClickException(str(err)) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    log.info(
        "codec server on http://%s:%d for %s; keys %s (current %s)",
        host,
        port,
        ", ".join(origins),
        ", ".join(sorted(keyring.keys)),
        keyring.current,
    )
    web.run_app(codec_app(EncryptionCodec(keyring), origins), host=host, port=port, print=None)
