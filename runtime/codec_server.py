"""`karpflow codec-server`: the Temporal Web UI (and `temporal --codec-endpoint`) read encrypted history
through it, with the same keys as the workers (runtime/payload_codec.py).

    karpflow codec-server --payload-key-file /etc/karpflow/payload-keys --port 8081 \\
        --cors-origin http://localhost:8233
    temporal server start-dev --ui-codec-endpoint http://127.0.0.1:8081      # or the UI's settings
    temporal workflow show --workflow-id ... --codec-endpoint http://127.0.0.1:8081

Temporal's remote codec protocol: `POST /decode` and `POST /encode` take and return
`{"payloads": [{"metadata": {...}, "data": "..."}]}` (the protobuf JSON of Payloads, bytes in base64).
The browser calls it from the UI's origin, so the answers carry CORS headers for the origins given
(`--cors-origin`, repeatable). An origin named is answered with credentials allowed (the UI may send its
cookies and access token); `*` answers any origin, but as `Access-Control-Allow-Origin: *` without
credentials, as the Fetch standard requires: a reflected origin with credentials would let any web page
a user opens read the history through the user's browser.

It decrypts for whoever reaches it, so it authenticates: `--auth-token-file` holds the bearer tokens it
accepts (one a line; `temporal ... --codec-auth "Bearer TOKEN"`, or the UI's "pass the access token"
behind a proxy that maps it). Without a token file it listens on loopback only (reach it by
port-forward); any other address without one is refused at start-up (SECURITY.md).
"""

from __future__ import annotations

import hmac
import ipaddress
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
ANY_ORIGIN = "*"


class TokenFileError(ValueError):
    """The token file is missing, unreadable or holds no token."""


def load_tokens(path: Path) -> frozenset[str]:
    """The bearer tokens in `path`: one a line; blank lines and `#` comments skipped."""
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise TokenFileError(f"{path}: {err.strerror or err}") from None
    tokens = frozenset(line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#"))
    if not tokens:
        raise TokenFileError(f"{path}: no token in it (one a line)")
    return tokens


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or `localhost`) reaches only this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def bearer_ok(header: str | None, tokens: frozenset[str]) -> bool:
    """`Authorization: Bearer <token>` with one of `tokens` (compared in constant time)."""
    scheme, _, given = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return False
    offered = given.strip().encode()
    # Every token compared, so the time taken says nothing of which one nearly matched.
    return any([hmac.compare_digest(offered, token.encode()) for token in tokens])


def codec_app(
    codec: PayloadCodec, origins: Sequence[str], tokens: frozenset[str] | None = None
) -> web.Application:
    """The codec endpoints; with `tokens`, /decode and /encode answer only requests bearing one."""
    allowed = set(origins)

    def cors(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if not origin:
            return response
        if origin in allowed:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Allow-Credentials"] = "true"
            response.headers["Vary"] = "Origin"
        elif ANY_ORIGIN in allowed:
            # Never reflected, never with credentials: any page may call it, none with the user's.
            response.headers["Access-Control-Allow-Origin"] = ANY_ORIGIN
        else:
            return response
        response.headers["Access-Control-Allow-Methods"] = "POST, OPTIONS"
        response.headers["Access-Control-Allow-Headers"] = ALLOWED_HEADERS
        return response

    def endpoint(
        apply: Callable[[Sequence[Payload]], Awaitable[list[Payload]]],
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            if tokens is not None and not bearer_ok(request.headers.get("Authorization"), tokens):
                refused = web.json_response(
                    {"message": "a bearer token is required (Authorization: Bearer TOKEN)"},
                    status=401,
                    headers={"WWW-Authenticate": 'Bearer realm="karpflow-codec"'},
                )
                return cors(request, refused)
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
    help="Origin of a Temporal Web UI allowed to call it, with credentials (repeatable; '*': any "
    "origin, without credentials).",
)
@click.option(
    "--auth-token-file",
    envvar="KARPFLOW_CODEC_AUTH_TOKEN_FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Bearer tokens it accepts, one a line; required unless --host is a loopback address "
    "[env KARPFLOW_CODEC_AUTH_TOKEN_FILE].",
)
def codec_server(
    payload_key_file: Path, host: str, port: int, origins: tuple[str, ...], auth_token_file: Path | None
) -> None:
    """Serve Temporal's remote codec (/decode, /encode) for the Web UI with the workers' keys."""
    if auth_token_file is None and not is_loopback(host):
        raise click.UsageError(
            f"--host {host} is reachable from other machines, and the codec server decrypts for anyone "
            "who reaches it: give --auth-token-file, or listen on 127.0.0.1 and reach it by port-forward"
        )
    try:
        keyring = load_keyring(payload_key_file)
        tokens = load_tokens(auth_token_file) if auth_token_file else None
    except (KeyFileError, TokenFileError) as err:
        raise click.ClickException(str(err)) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    log.info(
        "codec server on http://%s:%d for %s; keys %s (current %s); %s",
        host,
        port,
        ", ".join(origins),
        ", ".join(sorted(keyring.keys)),
        keyring.current,
        f"{len(tokens)} bearer token(s) accepted" if tokens else "no authentication (loopback only)",
    )
    app = codec_app(EncryptionCodec(keyring), origins, tokens)
    web.run_app(app, host=host, port=port, print=None)
