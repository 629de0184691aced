"""CustomResourceDefinitions: a CRD stored in the emulator (e.g. by `kubectl apply -f crd.yaml`)
registers its kind, as kube-apiserver's apiextensions server does.

- Serving: the storage version's kind, plural, singular, short names, categories, scope and the
  status subresource appear in discovery and OpenAPI and are stored like any other kind.
- Status: `NamesAccepted` and `Established` become True, so `kubectl wait --for
  condition=established` returns.
- Validation: objects are checked against the version's `openAPIV3Schema` (jsonschema; the
  `x-kubernetes-*` extensions are ignored) and refused with 422 and field paths, in kube-apiserver's
  wording (`spec.size: Invalid value: "big": spec.size in body must be of type integer: "string"`).
- Deleting the CRD stops serving the kind and deletes its objects.

Not reproduced: serving more than the storage version (no conversion), pruning of unknown fields,
defaulting, CEL rules. A CRD for a kind the emulator serves natively (Karpenter's NodePool,
NodeClaim, EC2NodeClass) is accepted and Established, and the native type keeps serving.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

import jsonschema

from sim.apiserver import resources
from sim.apiserver.errors import ApiError
from sim.apiserver.resources import ResourceType

log = logging.getLogger("sim.apiserver.crds")
FieldErrors = list[tuple[str, str, str]]
CRDS = "customresourcedefinitions"


def _served_version(spec: dict[str, Any]) -> dict[str, Any] | None:
    versions = [v for v in spec.get("versions") or [] if v.get("served", True)]
    return next((v for v in versions if v.get("storage")), versions[0] if versions else None)


def resource_type(crd: dict[str, Any]) -> ResourceType | None:
    """The kind a CRD defines (its storage version), or None when it defines nothing servable."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    version = _served_version(spec)
    if not (spec.get("group") and names.get("plural") and names.get("kind") and version):
        return None
    schema = (version.get("schema") or {}).get("openAPIV3Schema")
    return ResourceType(
        spec["group"],
        version["name"],
        names["kind"],
        names["plural"],
        names.get("singular") or names["kind"].lower(),
        spec.get("scope", "Namespaced") == "Namespaced",
        tuple(names.get("shortNames") or ()),
        tuple(names.get("categories") or ()),
        subresources=("status",) if "status" in (version.get("subresources") or {}) else (),
        custom=True,
        generation=True,
        schema=schema,
    )


def established_status(crd: dict[str, Any], now: datetime) -> dict[str, Any]:
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    conditions = [
        {"type": kind, "status": "True", "reason": reason, "message": message, "lastTransitionTime": stamp}
        for kind, reason, message in (
            ("NamesAccepted", "NoConflicts", "no conflicts found"),
            ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        )
    ]
    spec = crd.get("spec") or {}
    return {
        "conditions": conditions,
        "acceptedNames": spec.get("names") or {},
        "storedVersions": [v["name"] for v in spec.get("versions") or [] if v.get("storage")],
    }


def sync(store: Any) -> None:
    """Make what is served match the CRDs stored: register new ones (and mark them Established),
    stop serving and delete the objects of those gone."""
    stored = store.list(CRDS).items
    wanted: dict[tuple[str, str], ResourceType] = {}
    for crd in stored:
        rt = resource_type(crd)
        if rt is None:
            continue
        key = (rt.group, rt.plural)
        if not resources.is_builtin(*key):
            wanted[key] = rt
        if not any(c.get("type") == "Established" for c in (crd.get("status") or {}).get("conditions") or []):
            crd["status"] = established_status(crd, datetime.now(UTC))
            try:
                store.update_status(CRDS, crd)
            except ApiError as err:  # changed meanwhile: the next write syncs again
                log.debug("CRD %s status not written: %s", crd["metadata"]["name"], err)
    for key, rt in resources.registered().items():
        current = wanted.get(key)
        if current is None or (current.version, current.kind) != (rt.version, rt.kind):
            resources.unregister(*key)
            for obj in store.list(rt).items:
                meta = obj["metadata"]
                store.delete(rt, meta["name"], meta.get("namespace"), grace_period_seconds=0)
    for key, rt in wanted.items():
        existing = resources.registered().get(key)
        if existing is None or existing.schema != rt.schema:
            resources.register(rt)


def _path(error: jsonschema.ValidationError) -> str:
    out = ""
    for part in error.absolute_path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _reason(error: jsonschema.ValidationError, path: str) -> tuple[str, str]:
    value = json.dumps(error.instance)
    if error.validator == "type":
        actual = {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
            type(error.instance), "number" if isinstance(error.instance, int | float) else "null"
        )
        return "FieldValueTypeInvalid", (
            f'Invalid value: {value}: {path} in body must be of type {error.validator_value}: "{actual}"'
        )
    if error.validator == "required":
        return "FieldValueRequired", "Required value"
    if error.validator == "enum":
        allowed = ", ".join(json.dumps(v) for v in error.validator_value)
        return "FieldValueNotSupported", f"Unsupported value: {value}: supported values: {allowed}"
    return "FieldValueInvalid", f"Invalid value: {value}: {path} in body {error.message}"


def schema_errors(rt: ResourceType, obj: dict[str, Any]) -> FieldErrors:
    """Field errors of `obj` against the CRD's schema (empty without one)."""
    if rt.schema is None:
        return []
    # metadata is the API server's (name rules are checked elsewhere); the schema is about the rest
    checked = {k: v for k, v in obj.items() if k != "metadata"}
    schema = {
        **rt.schema,
        "properties": {k: v for k, v in (rt.schema.get("properties") or {}).items() if k != "metadata"},
    }
    errs: FieldErrors = []
    for error in sorted(
        jsonschema.Draft4Validator(schema).iter_errors(checked), key=lambda e: list(e.absolute_path)
    ):
        path = _path(error)
        if error.validator == "required":
            field = error.message.split("'")[1]
            path = f"{path}.{field}" if path else field
        kind, message = _reason(error, path)
        errs.append((path, kind, message))
    return errs
