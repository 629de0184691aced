"""A small but well-formed OpenAPI (v2 and v3) for kubectl.

kubectl reads the server's OpenAPI for `explain`, for client-side validation of `create -f` /
`apply`, and to find patch strategies of types it does not compile in. For the built-in kinds the
emulator does not publish full schemas: each is an object with `x-kubernetes-group-version-kind`
that keeps unknown fields. Enough for kubectl to accept any manifest the emulator stores, without
claiming validation the emulator does not do (kubectl uses its compiled-in types for built-in patch
strategies; custom resources only take merge and JSON patches anyway).

A custom resource's v3 schema is its CRD's `openAPIV3Schema` (for the kinds served natively,
Karpenter's bundled CRD's), with `apiVersion`, `kind` and `metadata` described as kube-apiserver
describes them and the kind's GVK, the way apiextensions-apiserver publishes it
(staging/src/k8s.io/apiextensions-apiserver/pkg/controller/openapi/builder/builder.go
`buildKubeNative`): `kubectl explain maintenancewindow.spec` (which reads /openapi/v3) prints the
CRD's descriptions. Not reproduced: ObjectMeta's own schema (metadata is an object described in one
line), the List kinds, and the CRD schemas in v2 (`kubectl explain --output plaintext-openapiv2`),
which stay generic.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import orjson

from sim.apiserver import crds
from sim.apiserver.resources import ResourceType, all_resources


def _definition_name(rt: ResourceType) -> str:
    group = rt.group or "core"
    reversed_group = ".".join(reversed(group.split("."))) if "." in group else group
    if not rt.custom:
        return f"io.k8s.api.{reversed_group}.{rt.version}.{rt.kind}"
    return f"{reversed_group}.{rt.version}.{rt.kind}"


# What apiextensions-apiserver puts beside a CRD's own fields (TypeMeta's and ObjectMeta's fields).
_TYPE_META = {
    "apiVersion": {
        "type": "string",
        "description": "APIVersion defines the versioned schema of this representation of an object.",
    },
    "kind": {"type": "string", "description": "Kind is a string value representing the REST resource."},
    "metadata": {"type": "object", "description": "Standard object's metadata."},
}


def _crd_schema(rt: ResourceType, crd_schema: dict[str, Any]) -> dict[str, Any]:
    schema = copy.deepcopy(crd_schema)
    schema.setdefault("type", "object")
    properties = schema.setdefault("properties", {})
    for name, definition in _TYPE_META.items():
        properties[name] = {**properties.get(name, {}), **definition}
    schema["x-kubernetes-group-version-kind"] = [{"group": rt.group, "version": rt.version, "kind": rt.kind}]
    return schema


def _v3_schema(rt: ResourceType) -> dict[str, Any]:
    crd_schema = crds.schema_for(rt) if rt.custom else None
    return _crd_schema(rt, crd_schema) if crd_schema is not None else _schema(rt)


def _schema(rt: ResourceType) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    }
    return {
        "type": "object",
        "description": f"{rt.kind} ({rt.api_version}), served by the karpflow Kubernetes emulator.",
        "properties": properties,
        "x-kubernetes-preserve-unknown-fields": True,
        "x-kubernetes-group-version-kind": [{"group": rt.group, "version": rt.version, "kind": rt.kind}],
    }


def _gv_path(rt: ResourceType) -> str:
    return f"api/{rt.version}" if not rt.group else f"apis/{rt.group}/{rt.version}"


def v2() -> dict[str, Any]:
    return {
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": {},
        "definitions": {_definition_name(rt): _schema(rt) for rt in all_resources()},
    }


def _object_path(rt: ResourceType) -> str:
    scope = "/namespaces/{namespace}" if rt.namespaced else ""
    return f"/{_gv_path(rt)}{scope}/{rt.plural}/{{name}}"


def _paths(rt: ResourceType) -> dict[str, Any]:
    """The object path with its PATCH operation: kubectl looks there for the GVK and for the
    `fieldValidation` query parameter before it sends `create`/`apply` (else it falls back to
    downloading the protobuf OpenAPI v2)."""
    ref = {"$ref": f"#/components/schemas/{_definition_name(rt)}"}
    operation = {
        "operationId": f"patch{rt.kind}",
        "parameters": [
            {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
        ],
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": ref}}}},
        "x-kubernetes-action": "patch",
        "x-kubernetes-group-version-kind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
    }
    return {_object_path(rt): {"patch": operation}}


def v3_document(gv_path: str) -> dict[str, Any] | None:
    rts = [rt for rt in all_resources() if _gv_path(rt) == gv_path]
    if not rts:
        return None
    paths: dict[str, Any] = {}
    for rt in rts:
        paths.update(_paths(rt))
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": {_definition_name(rt): _v3_schema(rt) for rt in rts}},
    }


def v3_root() -> dict[str, Any]:
    paths = {}
    for gv in sorted({_gv_path(rt) for rt in all_resources()}):
        digest = hashlib.sha512(orjson.dumps(v3_document(gv))).hexdigest()[:64].upper()
        paths[gv] = {"serverRelativeURL": f"/openapi/v3/{gv}?hash={digest}"}
    return {"paths": paths}
