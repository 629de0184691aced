"""The emulator's protobuf OpenAPI v2, read back by the protobuf runtime through a descriptor
written here from gnostic's openapiv2/OpenAPIv2.proto (the subset the emulator sends). kubectl
ignores a document it cannot parse, so this is where a broken encoding shows."""

from __future__ import annotations

import pytest
import yaml
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from sim.apiserver import openapi, openapi_protobuf

F = descriptor_pb2.FieldDescriptorProto
STRING, BOOL, MESSAGE = F.TYPE_STRING, F.TYPE_BOOL, F.TYPE_MESSAGE
ONE, MANY = F.LABEL_OPTIONAL, F.LABEL_REPEATED

MESSAGES = {
    "Document": [
        ("swagger", 1, STRING, ONE, None),
        ("info", 2, MESSAGE, ONE, "Info"),
        ("definitions", 9, MESSAGE, ONE, "Definitions"),
    ],
    "Info": [("title", 1, STRING, ONE, None), ("version", 2, STRING, ONE, None)],
    "Definitions": [("additional_properties", 1, MESSAGE, MANY, "NamedSchema")],
    "NamedSchema": [("name", 1, STRING, ONE, None), ("value", 2, MESSAGE, ONE, "Schema")],
    "Schema": [
        ("_ref", 1, STRING, ONE, None),
        ("description", 4, STRING, ONE, None),
        ("required", 19, STRING, MANY, None),
        ("additional_properties", 21, MESSAGE, ONE, "AdditionalPropertiesItem"),
        ("type", 22, MESSAGE, ONE, "TypeItem"),
        ("items", 23, MESSAGE, ONE, "ItemsItem"),
        ("properties", 25, MESSAGE, ONE, "Properties"),
        ("vendor_extension", 31, MESSAGE, MANY, "NamedAny"),
    ],
    "AdditionalPropertiesItem": [("schema", 1, MESSAGE, ONE, "Schema"), ("boolean", 2, BOOL, ONE, None)],
    "TypeItem": [("value", 1, STRING, MANY, None)],
    "ItemsItem": [("schema", 1, MESSAGE, MANY, "Schema")],
    "Properties": [("additional_properties", 1, MESSAGE, MANY, "NamedSchema")],
    "NamedAny": [("name", 1, STRING, ONE, None), ("value", 2, MESSAGE, ONE, "Any")],
    "Any": [("yaml", 2, STRING, ONE, None)],
}


@pytest.fixture(scope="module")
def document_class():
    file = descriptor_pb2.FileDescriptorProto(
        name="karpflow_test_openapiv2.proto", package="openapi.v2", syntax="proto3"
    )
    for name, fields in MESSAGES.items():
        message = file.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            field = message.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                field.type_name = f".openapi.v2.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("openapi.v2.Document"))


def test_the_protobuf_document_holds_every_kind_with_its_group_version_kind(document_class):
    source = openapi.v2()
    parsed = document_class.FromString(openapi_protobuf.document(source))
    assert parsed.swagger == "2.0" and parsed.info.title == "Kubernetes"
    definitions = {named.name: named.value for named in parsed.definitions.additional_properties}
    assert set(definitions) == set(source["definitions"])
    node = definitions["io.k8s.api.core.v1.Node"]
    assert list(node.type.value) == ["object"]
    assert {p.name for p in node.properties.additional_properties} >= {
        "apiVersion",
        "kind",
        "metadata",
        "spec",
    }
    extensions = {e.name: yaml.safe_load(e.value.yaml) for e in node.vendor_extension}
    assert extensions["x-kubernetes-group-version-kind"] == [{"group": "", "version": "v1", "kind": "Node"}]
    assert extensions["x-kubernetes-preserve-unknown-fields"] is True


def test_nested_schemas_refs_and_additional_properties_survive(document_class):
    source = {
        "swagger": "2.0",
        "info": {"title": "t", "version": "v"},
        "definitions": {
            "Widget": {
                "type": "object",
                "required": ["spec"],
                "properties": {
                    "spec": {"$ref": "#/definitions/Spec"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "free": {"type": "object", "additionalProperties": True},
                },
            }
        },
    }
    parsed = document_class.FromString(openapi_protobuf.document(source))
    widget = parsed.definitions.additional_properties[0].value
    assert list(widget.required) == ["spec"]
    properties = {p.name: p.value for p in widget.properties.additional_properties}
    assert properties["spec"]._ref == "#/definitions/Spec"
    assert list(properties["tags"].items.schema[0].type.value) == ["string"]
    assert list(properties["labels"].additional_properties.schema.type.value) == ["string"]
    assert properties["free"].additional_properties.boolean is True
