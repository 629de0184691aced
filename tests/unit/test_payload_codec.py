"""Payload encryption (runtime/payload_codec.py) and the Web UI's codec server (runtime/codec_server.py)."""

from __future__ import annotations

import base64
import json
import os

import pytest
from aiohttp.test_utils import TestClient, TestServer
from click.testing import CliRunner
from temporalio.api.common.v1 import Payload

from api.workflow_io import TerminationInput
from runtime.codec_server import TokenFileError, codec_app, codec_server, is_loopback, load_tokens
from runtime.connections import data_converter
from runtime.payload_codec import (
    ENCODING,
    KEY_ID,
    DecryptError,
    EncryptionCodec,
    KeyFileError,
    parse_keyring,
)
from runtime.settings import WorkerSettings

NODE = "ip-172-31-2-30.us-west-2.compute.internal"


def key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


K1, K2 = key(), key()


def codec(*lines: str) -> EncryptionCodec:
    return EncryptionCodec(parse_keyring("\n".join(lines)))


def plain(text: str) -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=json.dumps({"node": text}).encode())


async def test_a_payload_is_ciphertext_under_the_newest_key_and_comes_back_whole():
    ring = codec("# rotated yearly", f"2025={K1}", "", f"2026={K2}")
    (sealed,) = await ring.encode([plain(NODE)])
    assert sealed.metadata["encoding"] == ENCODING and sealed.metadata[KEY_ID] == b"2026"
    assert NODE.encode() not in sealed.data and b"json/plain" not in sealed.data
    (opened,) = await ring.decode([sealed])
    assert opened == plain(NODE)
    # Each encryption has its own nonce: the same payload never gives the same ciphertext.
    assert (await ring.encode([plain(NODE)]))[0].data != sealed.data


async def test_rotation_old_payloads_still_decrypt_and_a_dropped_key_is_named():
    (old,) = await codec(f"2025={K1}").encode([plain(NODE)])
    rotated = codec(f"2025={K1}", f"2026={K2}")
    assert (await rotated.decode([old]))[0] == plain(NODE)
    (new,) = await rotated.encode([plain(NODE)])
    assert new.metadata[KEY_ID] == b"2026"
    with pytest.raises(DecryptError, match="key '2025', which is not in the key file \\(2026\\)"):
        await codec(f"2026={K2}").decode([old])


async def test_tampered_or_foreign_ciphertext_is_refused_and_plain_payloads_pass():
    ring = codec(f"a={K1}")
    (sealed,) = await ring.encode([plain(NODE)])
    tampered = Payload(metadata=dict(sealed.metadata), data=sealed.data[:-1] + bytes([sealed.data[-1] ^ 1]))
    with pytest.raises(DecryptError, match="does not authenticate"):
        await ring.decode([tampered])
    # Another key under the same id (a mixed-up Secret) does not authenticate either.
    with pytest.raises(DecryptError):
        await codec(f"a={K2}").decode([sealed])
    assert (await ring.decode([plain("written before encryption")]))[0] == plain("written before encryption")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no key in it"),
        ("# only a comment\n", "no key in it"),
        (f"{K1}", "line 1: expected <key id>=<base64 key>"),
        (f"bad id={K1}", "line 1: expected <key id>="),
        ("k=not base64!!", "line 1: key 'k' is not base64"),
        (f"k={base64.b64encode(os.urandom(16)).decode()}", "is 16 bytes; AES-256 needs 32"),
        (f"k={K1}\nk={K2}", "line 2: key id 'k' appears twice"),
    ],
    # Stable ids: the keys are random, and pytest-xdist needs every process to collect the same names.
    ids=["empty", "comment-only", "no-id", "bad-id", "not-base64", "short-key", "duplicate-id"],
)
def test_a_bad_key_file_is_refused_with_the_line(text, message):
    with pytest.raises(KeyFileError, match=message):
        parse_keyring(text, "keys")


def test_the_worker_refuses_a_bad_key_file_before_it_connects(tmp_path):
    bad = tmp_path / "keys"
    bad.write_text("k=abc\n")
    with pytest.raises(ValueError, match="payload_key_file"):
        WorkerSettings(cluster_name="c", payload_key_file=bad)
    with pytest.raises(ValueError, match="No such file"):
        WorkerSettings(cluster_name="c", payload_key_file=tmp_path / "missing")


async def test_the_data_converter_encrypts_karpflows_models_end_to_end(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(f"k1={K1}\n")
    converter = data_converter(WorkerSettings(cluster_name="c", payload_key_file=keys))
    assert data_converter(WorkerSettings(cluster_name="c")).payload_codec is None
    value = TerminationInput(node=NODE, uid="u-1")
    (encoded,) = await converter.encode([value])
    assert NODE.encode() not in encoded.data
    (decoded,) = await converter.decode([encoded], [TerminationInput])
    assert decoded == value


def payloads_json(*payloads: Payload) -> dict:
    return {
        "payloads": [
            {
                "metadata": {k: base64.b64encode(v).decode() for k, v in p.metadata.items()},
                "data": base64.b64encode(p.data).decode(),
            }
            for p in payloads
        ]
    }


async def test_the_codec_server_decodes_for_the_ui_origin_only():
    ring = codec(f"k1={K1}")
    (sealed,) = await ring.encode([plain(NODE)])
    ui = "http://127.0.0.1:8233"
    async with TestClient(TestServer(codec_app(ring, [ui]))) as http:
        answer = await http.post(
            "/decode", json=payloads_json(sealed), headers={"Origin": ui, "X-Namespace": "default"}
        )
        assert answer.status == 200
        assert answer.headers["Access-Control-Allow-Origin"] == ui
        (decoded,) = (await answer.json())["payloads"]
        assert json.loads(base64.b64decode(decoded["data"])) == {"node": NODE}
        preflight = await http.options(
            "/decode", headers={"Origin": ui, "Access-Control-Request-Method": "POST"}
        )
        assert preflight.status == 204 and "X-Namespace" in preflight.headers["Access-Control-Allow-Headers"]
        stranger = await http.post("/decode", json=payloads_json(sealed), headers={"Origin": "http://evil"})
        assert "Access-Control-Allow-Origin" not in stranger.headers
        encoded = await http.post("/encode", json=payloads_json(plain(NODE)), headers={"Origin": ui})
        (again,) = (await encoded.json())["payloads"]
        assert NODE.encode() not in base64.b64decode(again["data"])
        assert (await http.post("/decode", data="{not json")).status == 400
        foreign = (await codec(f"k2={K2}").encode([plain(NODE)]))[0]
        refused = await http.post("/decode", json=payloads_json(foreign))
        assert refused.status == 400 and "k2" in (await refused.json())["message"]


async def test_any_origin_is_answered_without_credentials_and_never_reflected():
    ring = codec(f"k1={K1}")
    (sealed,) = await ring.encode([plain(NODE)])
    async with TestClient(TestServer(codec_app(ring, ["*"]))) as http:
        answer = await http.post("/decode", json=payloads_json(sealed), headers={"Origin": "http://evil"})
        assert answer.status == 200
        # A reflected origin with credentials would let any page read history with the user's cookies.
        assert answer.headers["Access-Control-Allow-Origin"] == "*"
        assert "Access-Control-Allow-Credentials" not in answer.headers


async def test_a_token_file_makes_the_codec_server_ask_for_a_bearer_token(tmp_path):
    ring = codec(f"k1={K1}")
    (sealed,) = await ring.encode([plain(NODE)])
    path = tmp_path / "tokens"
    path.write_text("# the CLI's\nt-one\n\n t-two \n")
    tokens = load_tokens(path)
    assert tokens == {"t-one", "t-two"}
    ui = "http://127.0.0.1:8233"
    async with TestClient(TestServer(codec_app(ring, [ui], tokens))) as http:
        body = payloads_json(sealed)
        missing = await http.post("/decode", json=body, headers={"Origin": ui})
        assert missing.status == 401 and missing.headers["WWW-Authenticate"].startswith("Bearer")
        assert missing.headers["Access-Control-Allow-Origin"] == ui  # the UI can show why
        wrong = await http.post("/decode", json=body, headers={"Authorization": "Bearer t-three"})
        assert wrong.status == 401
        basic = await http.post("/encode", json=body, headers={"Authorization": "Basic t-one"})
        assert basic.status == 401
        ok = await http.post("/decode", json=body, headers={"Authorization": "Bearer t-two"})
        assert ok.status == 200
        (decoded,) = (await ok.json())["payloads"]
        assert json.loads(base64.b64decode(decoded["data"])) == {"node": NODE}
        # A browser's preflight carries no credentials: it is answered, the POST is then checked.
        preflight = await http.options(
            "/decode", headers={"Origin": ui, "Access-Control-Request-Method": "POST"}
        )
        assert preflight.status == 204


def test_an_empty_or_missing_token_file_is_refused(tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n\n")
    with pytest.raises(TokenFileError, match="no token"):
        load_tokens(empty)
    with pytest.raises(TokenFileError, match="No such file"):
        load_tokens(tmp_path / "missing")


def test_the_codec_server_refuses_to_listen_beyond_loopback_without_tokens(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(f"k1={K1}\n")
    result = CliRunner().invoke(
        codec_server, ["--payload-key-file", str(keys), "--host", "0.0.0.0"], catch_exceptions=False
    )
    assert result.exit_code == 2
    assert "--auth-token-file" in result.output and "0.0.0.0" in result.output
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("codec.example")
