"""Payload encryption: what karpflow sends Temporal (workflow inputs and results, activity arguments,
signals, queries, failures) is stored as AES-256-GCM ciphertext, so Temporal's database and anyone who
reads raw history see no node, pod or instance in it (SECURITY.md says what stays readable).

Keys come from a file, e.g. a Kubernetes Secret mounted into the worker (`--payload-key-file`,
`KARPFLOW_PAYLOAD_KEY_FILE`), one key per line, the newest last:

    # <key id>=<32 random bytes, base64>     (openssl rand -base64 32)
    2026-01=Zm9vYmFyYmF6cXV4Li4uMzIgYnl0ZXMgb2Yga2V5Li4u
    2026-07=c2Vjb25kIGtleSAzMiBieXRlcyBsb25nIGV4YWN0bHkh

The newest key encrypts; every key in the file decrypts. A payload carries the id of its key in its
metadata (`encryption-key-id`), so rotating is: add a new last line, roll the workers, and drop an old
key only once no history still needs it (the workflows' retention). Payloads that are not encrypted
(written before encryption was turned on) pass through as they are.

The same codec serves the Web UI through `karpflow codec-server` (runtime/codec_server.py).
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec

ENCODING = b"binary/encrypted"
KEY_ID = "encryption-key-id"
NONCE_BYTES = 12
KEY_BYTES = 32
_KEY_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class KeyFileError(ValueError):
    """The key file cannot be used; the message names the file and the line."""


class DecryptError(ValueError):
    """A payload that cannot be decrypted (unknown key id, tampered or truncated ciphertext)."""


@dataclass(frozen=True)
class Keyring:
    keys: dict[str, bytes]  # key id -> 32-byte key
    current: str  # the id that encrypts

    def __post_init__(self) -> None:
        if self.current not in self.keys:
            raise KeyFileError(f"the current key {self.current!r} is not in the keyring")


def parse_keyring(text: str, source: str = "key file") -> Keyring:
    keys: dict[str, bytes] = {}
    current = ""
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key_id, sep, encoded = line.partition("=")
        key_id, encoded = key_id.strip(), encoded.strip()
        where = f"{source} line {number}"
        # A bare base64 key (no id) partitions at its padding into an id and nothing: the same mistake.
        if not sep or not encoded or not _KEY_ID_RE.match(key_id):
            raise KeyFileError(
                f"{where}: expected <key id>=<base64 key>, the id of 1-64 letters, digits, . _ -"
            )
        try:
            key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise KeyFileError(f"{where}: key {key_id!r} is not base64") from None
        if len(key) != KEY_BYTES:
            raise KeyFileError(
                f"{where}: key {key_id!r} is {len(key)} bytes; AES-256 needs {KEY_BYTES} "
                "(openssl rand -base64 32)"
            )
        if key_id in keys:
            raise KeyFileError(f"{where}: key id {key_id!r} appears twice")
        keys[key_id] = key
        current = key_id
    if not keys:
        raise KeyFileError(f"{source}: no key in it")
    return Keyring(keys, current)


def load_keyring(path: Path) -> Keyring:
    try:
        text = path.read_text()
    except OSError as err:
        raise KeyFileError(f"cannot read payload key file {path}: {err.strerror}") from None
    return parse_keyring(text, str(path))


class EncryptionCodec(PayloadCodec):
    """AES-256-GCM over each whole serialized payload (its own metadata included); the key id is the
    associated data, so a payload cannot be passed off as another key's."""

    def __init__(self, keyring: Keyring) -> None:
        self.keyring = keyring
        self._ciphers = {key_id: AESGCM(key) for key_id, key in keyring.keys.items()}

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.encrypt(p) for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.decrypt(p) for p in payloads]

    def encrypt(self, payload: Payload) -> Payload:
        key_id = self.keyring.current
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._ciphers[key_id].encrypt(nonce, payload.SerializeToString(), key_id.encode())
        return Payload(metadata={"encoding": ENCODING, KEY_ID: key_id.encode()}, data=nonce + sealed)

    def decrypt(self, payload: Payload) -> Payload:
        if payload.metadata.get("encoding") != ENCODING:
            return payload  # written before encryption was on: readable as it is
        key_id = payload.metadata.get(KEY_ID, b"").decode(errors="replace")
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            known = ", ".join(sorted(self._ciphers))
            raise DecryptError(
                f"payload encrypted with key {key_id!r}, which is not in the key file ({known})"
            )
        data = payload.data
        try:
            plain = cipher.decrypt(data[:NONCE_BYTES], data[NONCE_BYTES:], key_id.encode())
        except InvalidTag:
            raise DecryptError(
                f"payload under key {key_id!r} does not authenticate (tampered or truncated)"
            ) from None
        decoded = Payload()
        decoded.ParseFromString(plain)
        return decoded


def codec_from_file(path: Path | None) -> EncryptionCodec | None:
    return EncryptionCodec(load_keyring(path)) if path is not None else None
