"""The little of Kubernetes' protobuf encoding the emulator reads: request bodies that clients send
only as protobuf (kubectl's typed clients, e.g. `kubectl create token`).

A body is the magic `k8s\\x00` and a `runtime.Unknown` message (field 1 TypeMeta, field 2 the raw
object). The emulator decodes the few fields it needs by number (from k8s.io/api's generated.proto)
and answers in JSON, which those clients also accept.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

MAGIC = b"k8s\x00"
Field = tuple[int, int | bytes]


class WireError(ValueError):
    pass


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while at < len(data):
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
    raise WireError("truncated varint")


def fields(data: bytes) -> Iterator[Field]:
    """(field number, value) pairs of one message: ints for varints, bytes for everything else."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire_type = key >> 3, key & 7
        value: int | bytes
        if wire_type == 0:
            value, at = _varint(data, at)
        elif wire_type == 2:
            size, at = _varint(data, at)
            value, at = data[at : at + size], at + size
        elif wire_type in (1, 5):
            size = 8 if wire_type == 1 else 4
            value, at = data[at : at + size], at + size
        else:
            raise WireError(f"unsupported wire type {wire_type}")
        if at > len(data):
            raise WireError("truncated message")
        yield number, value


def unwrap(body: bytes) -> bytes:
    """The raw object inside the envelope."""
    if not body.startswith(MAGIC):
        raise WireError("not a Kubernetes protobuf body (no k8s magic)")
    for number, value in fields(body[len(MAGIC) :]):
        if number == 2 and isinstance(value, bytes):
            return value
    raise WireError("the protobuf envelope holds no object")


def token_request(body: bytes) -> dict[str, Any]:
    """authentication.k8s.io/v1 TokenRequest: spec (2) → audiences (1), expirationSeconds (4)."""
    spec: dict[str, Any] = {"audiences": []}
    for number, value in fields(unwrap(body)):
        if number != 2 or not isinstance(value, bytes):
            continue
        for inner, item in fields(value):
            if inner == 1 and isinstance(item, bytes):
                spec["audiences"].append(item.decode())
            elif inner == 4 and isinstance(item, int):
                spec["expirationSeconds"] = item
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
