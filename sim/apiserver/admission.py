"""What kube-apiserver does to an object before storing it: decoding, defaulting and validation.

Decoding comes first: a value of the wrong JSON type where the Go types want another (a string
for `spec`, a number for `metadata.name`, an unparseable resource quantity) is a 400 BadRequest
("Pod in version "v1" cannot be handled as a Pod: ..."), as kube-apiserver's decoder answers
before any validation; for custom resources, whose schema is OpenAPI, it is a 422 like the CRD
validator's. See `decode_error`; only the fields the emulator reads are typed.

Only the parts karpflow and its tests can observe are reproduced: name formats (422 Invalid),
workload selectors that must match their template, PDB minAvailable/maxUnavailable exclusivity,
resource quantities that may not be negative (`spec.containers[0].resources.requests[cpu]`),
pod defaults (grace period 30 s, the default not-ready/unreachable tolerations, QoS class), the
pod fields that are immutable after creation, and `metadata.finalizers` that may not grow while
an object is being deleted. Errors are (field path, reason type, message) triples that
`errors.invalid` turns into a 422 Status.
"""

from __future__ import annotations

import re
from typing import Any

from api import quantity
from api.constants import DEFAULT_POD_TOLERATIONS
from sim.apiserver import crds
from sim.apiserver.errors import ApiError, BadRequest, invalid
from sim.apiserver.resources import ResourceType
from sim.apiserver.selectors import label_key_error, label_value_error, selector_from_label_selector

FieldErrors = list[tuple[str, str, str]]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

DEFAULT_GRACE_SECONDS = 30


def name_errors(rt: ResourceType, name: str) -> FieldErrors:
    if not name:
        return [("metadata.name", "FieldValueRequired", "name or generateName is required")]
    if rt.kind == "Namespace":
        ok, what, limit = _DNS_LABEL.match(name), "RFC 1123 label", 63
    else:
        ok, what, limit = _DNS_SUBDOMAIN.match(name), "RFC 1123 subdomain", 253
    if not ok or len(name) > limit:
        return [
            (
                "metadata.name",
                "FieldValueInvalid",
                f"Invalid value: {name!r}: a lowercase {what} must consist of lower case alphanumeric "
                f"characters, '-' or '.', and must start and end with an alphanumeric character",
            )
        ]
    return []


def _metadata_errors(meta: dict[str, Any]) -> FieldErrors:
    errs: FieldErrors = []
    labels = meta.get("labels") or {}
    if not isinstance(labels, dict):
        return [("metadata.labels", "FieldValueInvalid", "must be a map of strings")]
    for key, value in labels.items():
        if err := label_key_error(key):
            errs.append((f"metadata.labels[{key}]", "FieldValueInvalid", err))
        if not isinstance(value, str) or (err := label_value_error(value)):
            errs.append((f"metadata.labels[{key}]", "FieldValueInvalid", err or "must be a string"))
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, dict) or not all(isinstance(v, str) for v in annotations.values()):
        errs.append(("metadata.annotations", "FieldValueInvalid", "must be a map of strings"))
    finalizers = meta.get("finalizers") or []
    if not isinstance(finalizers, list) or not all(isinstance(f, str) for f in finalizers):
        errs.append(("metadata.finalizers", "FieldValueInvalid", "must be a list of strings"))
    return errs


# --- decoding: JSON types ---------------------------------------------------------------------------


class _MapOf:
    """A JSON object whose values all have one shape (labels, resource lists)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


# A shape is "string", "boolean", "integer" or QUANTITY; a dict (a JSON object: the named fields
# have those shapes, other fields are not checked); a one-item list (an array of that shape); or
# _MapOf. null matches every shape: Go decodes it to the zero value.
QUANTITY = "quantity"
QUANTITY_MESSAGE = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)
_STRINGS = _MapOf("string")
_QUANTITIES = _MapOf(QUANTITY)
_META_SHAPE = {
    "name": "string",
    "namespace": "string",
    "generateName": "string",
    "labels": _STRINGS,
    "annotations": _STRINGS,
    "finalizers": ["string"],
    "ownerReferences": [{"apiVersion": "string", "kind": "string", "name": "string", "uid": "string"}],
}
_SELECTOR = {
    "matchLabels": _STRINGS,
    "matchExpressions": [{"key": "string", "operator": "string", "values": ["string"]}],
}
_CONTAINER = {
    "name": "string",
    "image": "string",
    "resources": {"requests": _QUANTITIES, "limits": _QUANTITIES},
}
_POD_SPEC = {
    "nodeName": "string",
    "containers": [_CONTAINER],
    "initContainers": [_CONTAINER],
    "tolerations": [{"key": "string", "operator": "string", "value": "string", "effect": "string"}],
    "nodeSelector": _STRINGS,
    "terminationGracePeriodSeconds": "integer",
    "overhead": _QUANTITIES,
}
_CONDITIONS = [{"type": "string", "status": "string"}]
_WORKLOAD_SHAPE = {
    "spec": {
        "replicas": "integer",
        "selector": _SELECTOR,
        "template": {"metadata": _META_SHAPE, "spec": _POD_SPEC},
    },
    "status": {},
}
_SHAPES: dict[str, dict[str, Any]] = {
    "Pod": {
        "spec": _POD_SPEC,
        "status": {"phase": "string", "conditions": _CONDITIONS, "containerStatuses": [{}]},
    },
    "Node": {
        "spec": {
            "taints": [{"key": "string", "value": "string", "effect": "string"}],
            "providerID": "string",
        },
        "status": {"capacity": _QUANTITIES, "allocatable": _QUANTITIES, "conditions": _CONDITIONS},
    },
    "PodDisruptionBudget": {"spec": {"selector": _SELECTOR}, "status": {}},
    "Deployment": _WORKLOAD_SHAPE,
    "ReplicaSet": _WORKLOAD_SHAPE,
    "DaemonSet": _WORKLOAD_SHAPE,
}
_ANY_SPEC = {"spec": {}, "status": {}}  # every kind's spec and status are objects
_GO_TYPES = {"string": "string", "boolean": "bool", "integer": "int64", QUANTITY: "resource.Quantity"}


def decode_error(rt: ResourceType, obj: dict[str, Any]) -> ApiError | None:
    """The error kube-apiserver's decoder would answer for `obj`, or None when it decodes."""
    found = _shape_error(obj, {"metadata": _META_SHAPE, **_SHAPES.get(rt.kind, _ANY_SPEC)}, "")
    if found is None:
        return None
    path, problem = found
    if rt.custom and not path.startswith("metadata"):
        name = str((obj.get("metadata") or {}).get("name") or "")
        return invalid(rt.kind, name, rt.group, [(path, "FieldValueTypeInvalid", problem)])
    return BadRequest(f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: {problem}')


def _shape_error(value: Any, shape: Any, path: str) -> tuple[str, str] | None:
    """The first (field path, problem) where `value` does not fit `shape`."""
    if value is None:
        return None
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return _mismatch(value, path, "object")
        for key, sub in shape.items():
            if (found := _shape_error(value.get(key), sub, f"{path}.{key}" if path else key)) is not None:
                return found
        return None
    if isinstance(shape, list):
        if not isinstance(value, list):
            return _mismatch(value, path, "array")
        return next(
            (f for i, v in enumerate(value) if (f := _shape_error(v, shape[0], f"{path}[{i}]"))), None
        )
    if isinstance(shape, _MapOf):
        if not isinstance(value, dict):
            return _mismatch(value, path, "object")
        for key, item in value.items():
            if not isinstance(key, str):  # only a Python caller can send one; orjson cannot store it
                return f"{path}[{key!r}]", f"{path}: keys must be strings, got {key!r}"
            if (found := _shape_error(item, shape.value, f"{path}[{key}]")) is not None:
                return found
        return None
    return _scalar_error(value, shape, path)


def _scalar_error(value: Any, shape: str, path: str) -> tuple[str, str] | None:
    if shape == QUANTITY:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            return _mismatch(value, path, QUANTITY)
        if isinstance(value, str) and not value.strip():
            return path, f"{path}: {QUANTITY_MESSAGE}"
        try:
            quantity.parse(value)
        except quantity.QuantityError:
            return path, f"{path}: {QUANTITY_MESSAGE}"
        return None
    ok = {
        "string": isinstance(value, str),
        "boolean": isinstance(value, bool),
        "integer": isinstance(value, int) and not isinstance(value, bool),
    }[shape]
    return None if ok else _mismatch(value, path, shape)


def _mismatch(value: Any, path: str, expected: str) -> tuple[str, str]:
    got = {bool: "bool", str: "string", list: "array", dict: "object"}.get(type(value), "number")
    go_type = _GO_TYPES.get(expected, expected)
    return path, f"json: cannot unmarshal {got} into Go struct field {path} of type {go_type}"


# --- defaulting --------------------------------------------------------------------------------------


def apply_defaults(rt: ResourceType, obj: dict[str, Any]) -> None:
    """Fill the defaults kube-apiserver fills on create (in place)."""
    fn = _DEFAULTS.get(rt.kind)
    if fn:
        fn(obj)


def _default_pod_spec(spec: dict[str, Any]) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        if isinstance(c, dict):
            image = str(c.get("image", ""))
            latest = ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest")
            c.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
            c.setdefault("terminationMessagePath", "/dev/termination-log")
            c.setdefault("terminationMessagePolicy", "File")
            c.setdefault("resources", {})
            for port in c.get("ports") or []:
                if isinstance(port, dict):
                    # pkg/apis/core/v1/defaults.go: TCP, and a host-network pod's ports are its host's.
                    port.setdefault("protocol", "TCP")
                    if spec.get("hostNetwork") and not port.get("hostPort"):
                        port["hostPort"] = port.get("containerPort")


def _qos_class(spec: dict[str, Any]) -> str:
    containers = [c for c in spec.get("containers") or [] if isinstance(c, dict)]
    requests_any = limits_all = False
    guaranteed = bool(containers)
    for c in containers:
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        if req or lim:
            requests_any = True
        for r in ("cpu", "memory"):
            if r not in lim or (r in req and str(req[r]) != str(lim[r])):
                guaranteed = False
        limits_all = limits_all or bool(lim)
    if guaranteed:
        return "Guaranteed"
    return "Burstable" if requests_any else "BestEffort"


def _default_pod(obj: dict[str, Any]) -> None:
    spec = obj.setdefault("spec", {})
    _default_pod_spec(spec)
    spec.setdefault("priority", 0)
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    tolerations = spec.setdefault("tolerations", [])
    if isinstance(tolerations, list):
        for default in DEFAULT_POD_TOLERATIONS:
            if not any(isinstance(t, dict) and t.get("key") == default["key"] for t in tolerations):
                tolerations.append(dict(default))
    status = obj.setdefault("status", {})
    status.setdefault("phase", "Pending")
    status.setdefault("qosClass", _qos_class(spec))


def _default_template(obj: dict[str, Any]) -> None:
    template = obj.setdefault("spec", {}).setdefault("template", {})
    _default_pod_spec(template.setdefault("spec", {}))


def _default_deployment(obj: dict[str, Any]) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("replicas", 1)
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("progressDeadlineSeconds", 600)
    spec.setdefault(
        "strategy", {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}}
    )
    _default_template(obj)


def _default_replicaset(obj: dict[str, Any]) -> None:
    obj.setdefault("spec", {}).setdefault("replicas", 1)
    _default_template(obj)


def _default_daemonset(obj: dict[str, Any]) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault(
        "updateStrategy", {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
    )
    _default_template(obj)


def _default_namespace(obj: dict[str, Any]) -> None:
    obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
    obj.setdefault("status", {})["phase"] = "Active"
    obj.setdefault("metadata", {}).setdefault("labels", {})["kubernetes.io/metadata.name"] = obj["metadata"][
        "name"
    ]


def _default_pdb(obj: dict[str, Any]) -> None:
    obj.setdefault("spec", {})
    obj["status"] = {"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0}


_DEFAULTS = {
    "Pod": _default_pod,
    "Deployment": _default_deployment,
    "ReplicaSet": _default_replicaset,
    "DaemonSet": _default_daemonset,
    "Namespace": _default_namespace,
    "PodDisruptionBudget": _default_pdb,
}


# --- Go zero values ------------------------------------------------------------------------------------

# kube-apiserver serializes Go structs, so a field without `omitempty` is always present (as "", 0 or
# false) once its parent is. Clients generated from the OpenAPI (kubernetes 37's pydantic models)
# treat such fields as required and refuse objects without them.
_NODE_INFO_FIELDS = (
    "architecture",
    "bootID",
    "containerRuntimeVersion",
    "kernelVersion",
    "kubeProxyVersion",
    "kubeletVersion",
    "machineID",
    "operatingSystem",
    "osImage",
    "systemUUID",
)
_CONTAINER_STATUS_ZERO = {"name": "", "ready": False, "restartCount": 0, "image": "", "imageID": ""}


def fill_zero_values(rt: ResourceType, obj: dict[str, Any]) -> None:
    """Add the always-serialized fields a real apiserver would emit (in place)."""
    status = obj.get("status")
    if not isinstance(status, dict):
        return
    if rt.kind == "Node" and isinstance(status.get("nodeInfo"), dict):
        info = status["nodeInfo"]
        for field in _NODE_INFO_FIELDS:
            info.setdefault(field, "")
    elif rt.kind == "Pod":
        for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
            for cs in status.get(key) or []:
                if isinstance(cs, dict):
                    for field, zero in _CONTAINER_STATUS_ZERO.items():
                        cs.setdefault(field, zero)


# --- validation ---------------------------------------------------------------------------------------


def validate(rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None = None) -> FieldErrors:
    """Field errors for a create (old is None) or an update of `obj`; empty when valid."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return [("metadata", "FieldValueRequired", "metadata is required")]
    errs = _metadata_errors(meta)
    if old is None:
        errs += name_errors(rt, meta.get("name", ""))
    else:
        old_meta = old["metadata"]
        if old_meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
            if added:
                errs.append(
                    (
                        "metadata.finalizers",
                        "FieldValueForbidden",
                        "Forbidden: no new finalizers can be added if the object is being deleted, "
                        f"found new finalizers {sorted(added)}",
                    )
                )
    fn = _VALIDATORS.get(rt.kind)
    if fn:
        errs += fn(obj, old)
    # a kind registered from a CustomResourceDefinition, or one of Karpenter's (their bundled CRDs)
    errs += crds.schema_errors(rt, obj, old)
    return errs


def _pod_spec_errors(spec: Any, where: str) -> FieldErrors:
    if not isinstance(spec, dict):
        return [(where, "FieldValueRequired", "Required value")]
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        return [(f"{where}.containers", "FieldValueRequired", "Required value")]
    errs: FieldErrors = []
    seen: set[str] = set()
    for i, c in enumerate(containers):
        if not isinstance(c, dict):
            errs.append((f"{where}.containers[{i}]", "FieldValueInvalid", "must be an object"))
            continue
        name = c.get("name")
        if not name:
            errs.append((f"{where}.containers[{i}].name", "FieldValueRequired", "Required value"))
        elif name in seen:
            errs.append(
                (f"{where}.containers[{i}].name", "FieldValueDuplicate", f"Duplicate value: {name!r}")
            )
        seen.add(str(name))
        if not c.get("image"):
            errs.append((f"{where}.containers[{i}].image", "FieldValueRequired", "Required value"))
    for key in ("containers", "initContainers"):
        for i, c in enumerate(spec.get(key) or []):
            resources = (c.get("resources") if isinstance(c, dict) else None) or {}
            for kind in ("requests", "limits"):
                errs += _negative_quantities(resources.get(kind), f"{where}.{key}[{i}].resources.{kind}")
    return errs


def _negative_quantities(values: dict[str, Any] | None, where: str) -> FieldErrors:
    """ValidateResourceQuantityValue: a resource amount may not be negative (decoding parsed it)."""
    return [
        (
            f"{where}[{name}]",
            "FieldValueInvalid",
            f'Invalid value: "{value}": must be greater than or equal to 0',
        )
        for name, value in (values or {}).items()
        if value is not None and quantity.parse(value) < 0
    ]


# Pod spec fields that may change after creation (ValidatePodUpdate allows these, plus
# additions to tolerations, which are compared separately).
_POD_MUTABLE = ("activeDeadlineSeconds", "terminationGracePeriodSeconds", "tolerations", "schedulingGates")


def _pod_errors(obj: dict[str, Any], old: dict[str, Any] | None) -> FieldErrors:
    errs = _pod_spec_errors(obj.get("spec"), "spec")
    if old is None or errs:
        return errs
    new_spec, old_spec = dict(obj["spec"]), dict(old.get("spec") or {})
    for field in _POD_MUTABLE:
        new_spec.pop(field, None)
        old_spec.pop(field, None)
    for spec in (new_spec, old_spec):
        for key in ("containers", "initContainers"):
            spec[key] = [{k: v for k, v in c.items() if k != "image"} for c in spec.get(key) or []]
    if new_spec != old_spec:
        changed = sorted(k for k in set(new_spec) | set(old_spec) if new_spec.get(k) != old_spec.get(k))
        errs.append(
            (
                "spec",
                "FieldValueForbidden",
                "Forbidden: pod updates may not change fields other than `spec.containers[*].image`, "
                "`spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` "
                "(only additions to existing tolerations), `spec.terminationGracePeriodSeconds` "
                f"(changed: {', '.join(changed)})",
            )
        )
    old_tolerations = (old.get("spec") or {}).get("tolerations") or []
    new_tolerations = obj["spec"].get("tolerations") or []
    if any(t not in new_tolerations for t in old_tolerations):
        errs.append(
            ("spec.tolerations", "FieldValueForbidden", "Forbidden: existing toleration can not be modified")
        )
    return errs


def _workload_errors(obj: dict[str, Any], old: dict[str, Any] | None) -> FieldErrors:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [("spec", "FieldValueRequired", "Required value")]
    errs: FieldErrors = []
    raw_selector = spec.get("selector")
    if not isinstance(raw_selector, dict) or not (
        raw_selector.get("matchLabels") or raw_selector.get("matchExpressions")
    ):
        errs.append(("spec.selector", "FieldValueRequired", "Required value"))
    template = spec.get("template")
    if not isinstance(template, dict):
        return [*errs, ("spec.template", "FieldValueRequired", "Required value")]
    errs += _pod_spec_errors(template.get("spec"), "spec.template.spec")
    if not errs:
        try:
            selector = selector_from_label_selector(raw_selector)
        except ValueError as err:
            return [("spec.selector", "FieldValueInvalid", str(err))]
        labels = (template.get("metadata") or {}).get("labels") or {}
        if not selector.matches(labels):
            errs.append(
                (
                    "spec.template.metadata.labels",
                    "FieldValueInvalid",
                    f"Invalid value: {labels}: `selector` does not match template `labels`",
                )
            )
    if old is not None and (old.get("spec") or {}).get("selector") != raw_selector:
        errs.append(("spec.selector", "FieldValueInvalid", "field is immutable"))
    replicas = spec.get("replicas")
    if replicas is not None and (not isinstance(replicas, int) or replicas < 0):
        errs.append(("spec.replicas", "FieldValueInvalid", "must be greater than or equal to 0"))
    return errs


def _pdb_errors(obj: dict[str, Any], old: dict[str, Any] | None) -> FieldErrors:
    spec = obj.get("spec") or {}
    if spec.get("minAvailable") is not None and spec.get("maxUnavailable") is not None:
        return [("spec", "FieldValueInvalid", "minAvailable and maxUnavailable cannot be both set")]
    errs: FieldErrors = []
    for field in ("minAvailable", "maxUnavailable"):
        value = spec.get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | str):
            errs.append((f"spec.{field}", "FieldValueInvalid", "must be an integer or a percentage"))
        elif isinstance(value, int) and value < 0:
            errs.append((f"spec.{field}", "FieldValueInvalid", "must be greater than or equal to 0"))
        elif isinstance(value, str) and not re.fullmatch(r"\d+%", value):
            errs.append(
                (
                    f"spec.{field}",
                    "FieldValueInvalid",
                    "a valid percent string must be a numeric string followed by an ending '%', "
                    f"got {value!r}",
                )
            )
    policy = spec.get("unhealthyPodEvictionPolicy")
    if policy not in (None, "IfHealthyBudget", "AlwaysAllow"):
        errs.append(
            (
                "spec.unhealthyPodEvictionPolicy",
                "FieldValueNotSupported",
                f'Unsupported value: {policy!r}: supported values: "AlwaysAllow", "IfHealthyBudget"',
            )
        )
    try:
        selector_from_label_selector(spec.get("selector"))
    except ValueError as err:
        errs.append(("spec.selector", "FieldValueInvalid", str(err)))
    return errs


def _node_errors(obj: dict[str, Any], old: dict[str, Any] | None) -> FieldErrors:
    status = obj.get("status") or {}
    errs = _negative_quantities(status.get("capacity"), "status.capacity")
    errs += _negative_quantities(status.get("allocatable"), "status.allocatable")
    taints = (obj.get("spec") or {}).get("taints") or []
    seen = set()
    for i, t in enumerate(taints):
        if not isinstance(t, dict) or not t.get("key"):
            errs.append((f"spec.taints[{i}].key", "FieldValueRequired", "Required value"))
            continue
        if t.get("effect") not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            errs.append(
                (
                    f"spec.taints[{i}].effect",
                    "FieldValueNotSupported",
                    f'Unsupported value: {t.get("effect")!r}: supported values: "NoSchedule", '
                    '"PreferNoSchedule", "NoExecute"',
                )
            )
        if (t.get("key"), t.get("effect")) in seen:
            errs.append(
                (f"spec.taints[{i}]", "FieldValueDuplicate", "taints must be unique by key and effect pair")
            )
        seen.add((t.get("key"), t.get("effect")))
    if old is not None:
        old_pid = (old.get("spec") or {}).get("providerID")
        if old_pid and (obj.get("spec") or {}).get("providerID") != old_pid:
            errs.append(
                (
                    "spec.providerID",
                    "FieldValueForbidden",
                    'Forbidden: node updates may not change providerID except from "" to valid',
                )
            )
    return errs


_VALIDATORS = {
    "Pod": _pod_errors,
    "Deployment": _workload_errors,
    "ReplicaSet": _workload_errors,
    "DaemonSet": _workload_errors,
    "PodDisruptionBudget": _pdb_errors,
    "Node": _node_errors,
}
