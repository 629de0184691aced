"""The emulator's reader of kubectl's protobuf TokenRequest (the bytes are built by hand here from
the field numbers in k8s.io/api/authentication/v1/generated.proto)."""

from __future__ import annotations

import pytest

from sim.apiserver.protobuf_wire import MAGIC, WireError, token_request


def _field(number: int, payload: bytes) -> bytes:
    return bytes([number << 3 | 2, len(payload)]) + payload


def test_audiences_and_expiration_are_read_from_the_envelope():
    spec = _field(1, b"https://kubernetes.default.svc") + bytes([4 << 3 | 0]) + b"\x90\x1c"  # 3600
    raw = _field(1, b"") + _field(2, spec)
    body = MAGIC + _field(1, b"") + _field(2, raw)
    assert token_request(body)["spec"] == {
        "audiences": ["https://kubernetes.default.svc"],
        "expirationSeconds": 3600,
    }


@pytest.mark.parametrize("body", [b'{"spec": {}}', MAGIC + b"\x12\x05ab", MAGIC + b"\x0f"])
def test_what_is_not_a_token_request_is_refused(body):
    with pytest.raises(WireError):
        token_request(body)
