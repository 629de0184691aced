"""CustomResourceDefinitions: a CRD stored in the emulator (e.g. by `kubectl apply -f crd.yaml`)
registers its kind, as kube-apiserver's apiextensions server does; Karpenter's own CRDs validate the
kinds the emulator serves natively.

- Serving: the storage version's kind, plural, singular, short names, categories, scope and the
  status subresource appear in discovery and OpenAPI and are stored like any other kind.
- Printing and explaining: `kubectl get` shows the version's `additionalPrinterColumns`
  (tables.py; Age alone when it names none) and `kubectl explain` the descriptions of its schema
  (openapi.py), for the kinds served natively from Karpenter's bundled CRDs.
- Status: `NamesAccepted` and `Established` become True, so `kubectl wait --for
  condition=established` returns.
- Validation: objects are checked against the version's `openAPIV3Schema` after its defaults are
  applied (jsonschema: types, required, enum, pattern, lengths, min/max, item and property counts)
  and against its CEL rules (`x-kubernetes-validations`, sim/apiserver/cel.py), with the old object
  for transition rules. Errors are 422s with field paths in kube-apiserver's wording
  (`spec.disruption.consolidateAfter: Invalid value: "-5m": spec.disruption.consolidateAfter in body
  should match '^(([0-9]+(s|m|h))+|Never)$'`, `spec.disruption.budgets: Invalid value: "array":
  'schedule' must be set with 'duration'`).
- Karpenter's NodePool, NodeClaim, NodeOverlay and EC2NodeClass, which the emulator serves natively,
  are validated by Karpenter's published CRDs (karpenter_crds/: the AWS provider's release v1.14.1;
  its README.md says where each comes from and how to refresh them).
  A CRD applied for one of these kinds is accepted and Established; the bundled CRD keeps validating.
- Deleting the CRD stops serving the kind and deletes its objects.

Not reproduced: serving more than the storage version (no conversion), pruning of unknown fields
(and `fieldValidation=Strict` refusing them), storing the defaults (they are applied to validate
only: the simulator's seeded nodes carry drift hashes of the objects as written), validation
ratcheting of unchanged invalid fields on update.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from sim.apiserver import cel, resources
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
        printer_columns=tuple(version.get("additionalPrinterColumns") or ()),
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
        if existing is None or (existing.schema, existing.printer_columns) != (rt.schema, rt.printer_columns):
            resources.register(rt)


# --- Karpenter's CRDs, for the kinds served natively ---------------------------------------------------

_BUNDLED = Path(__file__).with_name("karpenter_crds")


@functools.cache
def bundled_crds() -> dict[tuple[str, str], dict[str, Any]]:
    """Karpenter's CRDs carried as data, by (group, plural)."""
    out = {}
    for path in sorted(_BUNDLED.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        out[(crd["spec"]["group"], crd["spec"]["names"]["plural"])] = crd
    return out


def schema_for(rt: ResourceType) -> dict[str, Any] | None:
    """The openAPIV3Schema objects of `rt` are validated with: its CRD's, or for a kind served
    natively Karpenter's bundled CRD's (None: no schema, nothing to check)."""
    if rt.schema is not None:
        return rt.schema
    return ((_bundled_version(rt) or {}).get("schema") or {}).get("openAPIV3Schema")


def _bundled_version(rt: ResourceType) -> dict[str, Any] | None:
    crd = bundled_crds().get((rt.group, rt.plural)) if rt.custom else None
    if crd is None:
        return None
    return next((v for v in crd["spec"]["versions"] if v["name"] == rt.version), None)


# The column every custom resource gets when its CRD names none (apiextensions-apiserver
# pkg/apis/apiextensions/helpers.go `serveDefaultColumnsIfEmpty`).
DEFAULT_COLUMNS = ({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},)


def printer_columns_for(rt: ResourceType) -> tuple[dict[str, Any], ...] | None:
    """The additionalPrinterColumns a custom resource's table shows: its CRD's (for a kind served
    natively, Karpenter's bundled CRD's), Age alone when the CRD has none; None for a built-in kind."""
    if not rt.custom:
        return None
    if rt.schema is not None or rt.printer_columns:
        columns = rt.printer_columns
    else:
        columns = tuple((_bundled_version(rt) or {}).get("additionalPrinterColumns") or ())
    return columns or DEFAULT_COLUMNS


# --- defaulting ----------------------------------------------------------------------------------------


def defaulted(schema: dict[str, Any], value: Any) -> Any:
    """A copy of `value` as kube-apiserver sees it before validation: a null where the schema does not
    allow one is dropped, then each missing property with a `default` gets it (recursively, so a
    default object is itself defaulted)."""
    value = copy.deepcopy(value)
    _default(schema, value)
    return value


def _default(schema: dict[str, Any], value: Any) -> None:
    if not isinstance(schema, dict):
        return
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        nulls = [k for k, v in value.items() if v is None and not (properties.get(k) or {}).get("nullable")]
        for key in nulls:
            del value[key]
        for key, sub in properties.items():
            if key not in value and isinstance(sub, dict) and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                _default(sub, value[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in value:
                if key not in properties:
                    _default(extra, value[key])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            _default(schema["items"], item)


# --- validation ----------------------------------------------------------------------------------------


def _path(error: jsonschema.ValidationError) -> str:
    out = ""
    for part in error.absolute_path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# kube-openapi's wording for the checks that become `Invalid value` (validate/errors.go).
_MESSAGES = {
    "pattern": "should match '{}'",
    "minimum": "should be greater than or equal to {}",
    "maximum": "should be less than or equal to {}",
    "minLength": "should be at least {} chars long",
    "minItems": "should have at least {} items",
    "minProperties": "should have at least {} properties",
    "multipleOf": "should be a multiple of {}",
}


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
    if error.validator == "maxLength":
        return "FieldValueTooLong", f"Too long: may not be more than {error.validator_value} bytes"
    if error.validator in ("maxItems", "maxProperties"):
        what = "items" if error.validator == "maxItems" else "properties"
        return "FieldValueTooMany", (
            f"Too many: {len(error.instance)}: must have at most {error.validator_value} {what}"
        )
    if error.validator in _MESSAGES:
        detail = _MESSAGES[str(error.validator)].format(error.validator_value)
        return "FieldValueInvalid", f"Invalid value: {value}: {path} in body {detail}"
    return "FieldValueInvalid", f"Invalid value: {value}: {path} in body {error.message}"


def _without_metadata(schema: dict[str, Any], obj: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    # metadata is the API server's (name rules are checked elsewhere); the schema is about the rest
    checked = {k: v for k, v in obj.items() if k != "metadata"}
    schema = {
        **schema,
        "properties": {k: v for k, v in (schema.get("properties") or {}).items() if k != "metadata"},
    }
    return schema, checked


def schema_errors(rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None = None) -> FieldErrors:
    """Field errors of `obj` (an update of `old`) against the schema and the CEL rules of its CRD
    (empty without one)."""
    full = schema_for(rt)
    if full is None:
        return []
    schema, checked = _without_metadata(full, obj)
    checked = defaulted(schema, checked)
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
    previous = defaulted(schema, _without_metadata(full, old)[1]) if old is not None else None
    return errs + cel.rule_errors(schema, checked, previous, "", old is not None)
