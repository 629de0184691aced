"""OpenAPI v2 as kubectl asks for it: gnostic's `openapi.v2.Document` in protobuf
(`Accept: application/com.github.proto-openapi.spec.v2...+protobuf`). kubectl reads it for the
three-way merge of `apply` and for `diff`; a 406 there makes it fall back to compiled-in types,
which a real server never causes.

Only what sim/apiserver/openapi.py's v2 document holds is encoded: swagger, info, definitions, and
per schema type, description, properties, items, required, additionalProperties, $ref and the
`x-` vendor extensions (as YAML, the way kube-apiserver writes them). Field numbers are those of
gnostic's openapiv2/OpenAPIv2.proto.
"""

from __future__ import annotations

from typing import Any

import yaml

CONTENT_TYPE = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"

# openapi.v2.Document
_DOC_SWAGGER, _DOC_INFO, _DOC_DEFINITIONS = 1, 2, 9
_INFO_TITLE, _INFO_VERSION = 1, 2
# openapi.v2.Schema
_REF, _DESCRIPTION, _REQUIRED, _ADDITIONAL, _TYPE, _ITEMS, _PROPERTIES, _VENDOR = 1, 4, 19, 21, 22, 23, 25, 31
# NamedSchema / NamedAny: name 1, value 2; Any: yaml 2; TypeItem and ItemsItem: 1;
# AdditionalPropertiesItem: schema 1, boolean 2


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _bytes(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _string(number: int, text: str) -> bytes:
    return _bytes(number, text.encode())


def _bool(number: int, value: bool) -> bytes:
    return _varint(number << 3) + _varint(int(value))


def _named(name: str, value: bytes) -> bytes:
    return _string(1, name) + _bytes(2, value)


def schema(doc: dict[str, Any]) -> bytes:
    out = b""
    if "$ref" in doc:
        out += _string(_REF, doc["$ref"])
    if doc.get("description"):
        out += _string(_DESCRIPTION, doc["description"])
    for name in doc.get("required", ()):
        out += _string(_REQUIRED, name)
    additional = doc.get("additionalProperties")
    if isinstance(additional, bool):
        out += _bytes(_ADDITIONAL, _bool(2, additional))
    elif isinstance(additional, dict):
        out += _bytes(_ADDITIONAL, _bytes(1, schema(additional)))
    if "type" in doc:
        types = doc["type"] if isinstance(doc["type"], list) else [doc["type"]]
        out += _bytes(_TYPE, b"".join(_string(1, t) for t in types))
    if "items" in doc:
        out += _bytes(_ITEMS, _bytes(1, schema(doc["items"])))
    if "properties" in doc:
        named = b"".join(_bytes(1, _named(k, schema(v))) for k, v in doc["properties"].items())
        out += _bytes(_PROPERTIES, named)
    for key, value in doc.items():
        if key.startswith("x-"):
            any_value = _string(2, yaml.safe_dump(value, default_flow_style=False))
            out += _bytes(_VENDOR, _named(key, any_value))
    return out


def document(doc: dict[str, Any]) -> bytes:
    """The v2 document (as sim/apiserver/openapi.py's `v2()` makes it) in protobuf."""
    info = doc.get("info", {})
    definitions = b"".join(
        _bytes(1, _named(name, schema(value))) for name, value in doc.get("definitions", {}).items()
    )
    return (
        _string(_DOC_SWAGGER, doc.get("swagger", "2.0"))
        + _bytes(
            _DOC_INFO,
            _string(_INFO_TITLE, info.get("title", "")) + _string(_INFO_VERSION, info.get("version", "")),
        )
        + _bytes(_DOC_DEFINITIONS, definitions)
    )
