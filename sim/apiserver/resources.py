"""The resource types the emulator serves, described once: names, scope, subresources, patch keys.

Everything that depends on *which* resource a request is about reads it from here: URL routing,
discovery documents, strategic-merge patch keys, selectable fields for field selectors, whether a
spec change bumps `metadata.generation`, whether status is isolated behind `/status`.

Patch strategies mirror the `patchStrategy`/`patchMergeKey` struct tags of the real Go types
(k8s.io/api). Paths list field names only (list items add no path element), e.g. `env` inside each
container of a pod is `("spec", "containers", "env")`. A list that is not named here is replaced
whole by a strategic-merge patch, exactly as kube-apiserver does (node `spec.taints`, pod
`spec.tolerations`, `status.containerStatuses`, label selector `matchExpressions`...). Custom
resources have no Go types, so kube-apiserver refuses strategic merge for them (415).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

from api.constants import AWS_GROUP, AWS_VERSION, KARPENTER_GROUP, KARPENTER_VERSION


@dataclass(frozen=True)
class MergeRule:
    """How a strategic-merge patch combines one list (or map, for retainKeys) field."""

    key: str | None = None  # patchMergeKey; None with merge=True means a list of scalars merged as a set
    merge: bool = True  # patchStrategy "merge"
    retain_keys: bool = False  # patchStrategy "retainKeys" (honours the $retainKeys directive)


Path = tuple[str, ...]

# ObjectMeta, shared by every built-in type.
_META: dict[Path, MergeRule] = {
    ("metadata", "finalizers"): MergeRule(),
    ("metadata", "ownerReferences"): MergeRule(key="uid"),
}

# core/v1 PodSpec, relative to the spec object.
_POD_SPEC: dict[Path, MergeRule] = {
    ("volumes",): MergeRule(key="name", retain_keys=True),
    ("initContainers",): MergeRule(key="name"),
    ("containers",): MergeRule(key="name"),
    ("ephemeralContainers",): MergeRule(key="name"),
    ("imagePullSecrets",): MergeRule(key="name"),
    ("hostAliases",): MergeRule(key="ip"),
    ("topologySpreadConstraints",): MergeRule(key="topologyKey"),
    ("schedulingGates",): MergeRule(key="name"),
    ("resourceClaims",): MergeRule(key="name", retain_keys=True),
}
# core/v1 Container, relative to one container.
_CONTAINER: dict[Path, MergeRule] = {
    ("ports",): MergeRule(key="containerPort"),
    ("env",): MergeRule(key="name"),
    ("volumeMounts",): MergeRule(key="mountPath"),
    ("volumeDevices",): MergeRule(key="devicePath"),
}


def _pod_spec_rules(prefix: Path) -> dict[Path, MergeRule]:
    rules = {prefix + p: r for p, r in _POD_SPEC.items()}
    for containers in ("initContainers", "containers", "ephemeralContainers"):
        rules.update({(*prefix, containers, *p): r for p, r in _CONTAINER.items()})
    return rules


_CONDITIONS_BY_TYPE = {("status", "conditions"): MergeRule(key="type")}

_POD_RULES = {
    **_META,
    **_pod_spec_rules(("spec",)),
    **_CONDITIONS_BY_TYPE,
    ("status", "podIPs"): MergeRule(key="ip"),
    ("status", "hostIPs"): MergeRule(key="ip"),
    ("status", "resourceClaimStatuses"): MergeRule(key="name", retain_keys=True),
}
_NODE_RULES = {
    **_META,
    ("spec", "podCIDRs"): MergeRule(),
    **_CONDITIONS_BY_TYPE,
    ("status", "addresses"): MergeRule(key="type"),
}
_WORKLOAD_RULES = {**_META, **_pod_spec_rules(("spec", "template", "spec")), **_CONDITIONS_BY_TYPE}
_DEPLOYMENT_RULES = {**_WORKLOAD_RULES, ("spec", "strategy"): MergeRule(merge=False, retain_keys=True)}


# --- selectable fields (field selectors) ------------------------------------------------------------


def _get(obj: dict[str, Any], *path: str) -> Any:
    for part in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)  # type: ignore[assignment]
    return obj


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _meta_fields(obj: dict[str, Any]) -> dict[str, str]:
    meta = obj.get("metadata") or {}
    return {"metadata.name": _text(meta.get("name")), "metadata.namespace": _text(meta.get("namespace"))}


def _pod_fields(obj: dict[str, Any]) -> dict[str, str]:
    # Called on every pod write: direct lookups, no generic path walking.
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    return {
        "metadata.name": _text(meta.get("name")),
        "metadata.namespace": _text(meta.get("namespace")),
        "spec.nodeName": _text(spec.get("nodeName")),
        "spec.restartPolicy": _text(spec.get("restartPolicy")),
        "spec.schedulerName": _text(spec.get("schedulerName")),
        "spec.serviceAccountName": _text(spec.get("serviceAccountName")),
        "spec.hostNetwork": "true" if spec.get("hostNetwork") else "false",
        "status.phase": _text(status.get("phase")),
        "status.podIP": _text(status.get("podIP")),
        "status.nominatedNodeName": _text(status.get("nominatedNodeName")),
    }


def _node_fields(obj: dict[str, Any]) -> dict[str, str]:
    fields = _meta_fields(obj)
    fields["spec.unschedulable"] = _text(bool(_get(obj, "spec", "unschedulable")))
    return fields


def _namespace_fields(obj: dict[str, Any]) -> dict[str, str]:
    fields = _meta_fields(obj)
    fields["status.phase"] = _text(_get(obj, "status", "phase"))
    return fields


def _event_fields(obj: dict[str, Any]) -> dict[str, str]:
    fields = _meta_fields(obj)
    for name in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath"):
        fields[f"involvedObject.{name}"] = _text(_get(obj, "involvedObject", name))
    for name in ("reason", "reportingComponent", "type"):
        fields[name] = _text(obj.get(name))
    fields["source"] = _text(_get(obj, "source", "component"))
    return fields


# --- the registry ------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)  # one instance per type: identity is equality
class ResourceType:
    group: str  # "" for the core group
    version: str
    kind: str
    plural: str
    singular: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()  # "status", "eviction", "binding"
    custom: bool = False  # a CustomResourceDefinition: no strategic merge, status dropped on create
    generation: bool = False  # metadata.generation tracks spec changes
    merge_rules: dict[Path, MergeRule] = field(default_factory=lambda: dict(_META))
    fields: Callable[[dict[str, Any]], dict[str, str]] = _meta_fields
    # kube-apiserver drops status on create for most types; nodes keep what the kubelet sent.
    keep_status_on_create: bool = False
    # A type registered from a CustomResourceDefinition: its served version's openAPIV3Schema and
    # additionalPrinterColumns (sim/apiserver/crds.py).
    schema: dict[str, Any] | None = None
    printer_columns: tuple[dict[str, Any], ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def group_resource(self) -> str:
        """`pods`, `deployments.apps`: how kube-apiserver names the resource in error messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    @property
    def verbs(self) -> list[str]:
        return ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]

    @cached_property
    def field_names(self) -> tuple[str, ...]:
        """The fields a field selector may name for this type."""
        return tuple(self.fields({}))

    @cached_property
    def _field_values_type(self) -> type[FieldValues]:
        return type(
            f"{self.kind}Fields",
            (FieldValues,),
            {"__slots__": (), "_index": {name: i for i, name in enumerate(self.field_names)}},
        )

    def selectable_fields(self, obj: dict[str, Any]) -> FieldValues:
        """The object's selectable field values, compact (a tuple) and with interned strings."""
        values = self.fields(obj)
        return self._field_values_type(sys.intern(values[name]) for name in self.field_names)


class FieldValues(tuple):
    """Selectable field values of one object, in its type's `field_names` order.

    A tuple, not a dict, because the store keeps one per object (100k pods); `get` gives the dict
    view field selectors need."""

    __slots__ = ()
    _index: ClassVar[dict[str, int]] = {}

    def get(self, name: str, default: str | None = None) -> str | None:
        i = self._index.get(name)
        return default if i is None else self[i]


_STATUS = ("status",)
RBAC_GROUP = "rbac.authorization.k8s.io"
CRD_GROUP = "apiextensions.k8s.io"

RESOURCES: tuple[ResourceType, ...] = (
    ResourceType(
        "",
        "v1",
        "Namespace",
        "namespaces",
        "namespace",
        False,
        ("ns",),
        subresources=_STATUS,
        fields=_namespace_fields,
    ),
    ResourceType(
        "",
        "v1",
        "Node",
        "nodes",
        "node",
        False,
        ("no",),
        subresources=_STATUS,
        merge_rules=_NODE_RULES,
        fields=_node_fields,
        keep_status_on_create=True,
    ),
    ResourceType(
        "",
        "v1",
        "Pod",
        "pods",
        "pod",
        True,
        ("po",),
        ("all",),
        subresources=("status", "eviction", "binding"),
        generation=True,
        merge_rules=_POD_RULES,
        fields=_pod_fields,
    ),
    ResourceType("", "v1", "Event", "events", "event", True, ("ev",), fields=_event_fields),
    ResourceType(
        "policy",
        "v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        "poddisruptionbudget",
        True,
        ("pdb",),
        subresources=_STATUS,
        generation=True,
        merge_rules={**_META, **_CONDITIONS_BY_TYPE},
    ),
    ResourceType(
        "apps",
        "v1",
        "Deployment",
        "deployments",
        "deployment",
        True,
        ("deploy",),
        ("all",),
        subresources=_STATUS,
        generation=True,
        merge_rules=_DEPLOYMENT_RULES,
    ),
    ResourceType(
        "apps",
        "v1",
        "ReplicaSet",
        "replicasets",
        "replicaset",
        True,
        ("rs",),
        ("all",),
        subresources=_STATUS,
        generation=True,
        merge_rules=_WORKLOAD_RULES,
    ),
    ResourceType(
        "apps",
        "v1",
        "DaemonSet",
        "daemonsets",
        "daemonset",
        True,
        ("ds",),
        ("all",),
        subresources=_STATUS,
        generation=True,
        merge_rules=_WORKLOAD_RULES,
    ),
    ResourceType(
        "storage.k8s.io",
        "v1",
        "VolumeAttachment",
        "volumeattachments",
        "volumeattachment",
        False,
        subresources=_STATUS,
    ),
    ResourceType("coordination.k8s.io", "v1", "Lease", "leases", "lease", True),
    # What CapacityBuffers name (karpflow reads them: planner/capacity_buffers.py).
    ResourceType("", "v1", "PodTemplate", "podtemplates", "podtemplate", True),
    # What a deployment of karpflow stores (deploy/), and what the secure mode authorizes by.
    ResourceType(
        "",
        "v1",
        "ServiceAccount",
        "serviceaccounts",
        "serviceaccount",
        True,
        ("sa",),
        subresources=("token",),
    ),
    ResourceType("", "v1", "ConfigMap", "configmaps", "configmap", True, ("cm",)),
    # The workers' metrics Service (deploy/base/metrics-service.yaml); stored, nothing routes it.
    ResourceType("", "v1", "Service", "services", "service", True, ("svc",), subresources=_STATUS),
    ResourceType("", "v1", "Secret", "secrets", "secret", True),
    ResourceType(
        "networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", "networkpolicy", True, ("netpol",)
    ),
    ResourceType(
        "scheduling.k8s.io", "v1", "PriorityClass", "priorityclasses", "priorityclass", False, ("pc",)
    ),
    ResourceType(RBAC_GROUP, "v1", "ClusterRole", "clusterroles", "clusterrole", False),
    ResourceType(RBAC_GROUP, "v1", "ClusterRoleBinding", "clusterrolebindings", "clusterrolebinding", False),
    ResourceType(RBAC_GROUP, "v1", "Role", "roles", "role", True),
    ResourceType(RBAC_GROUP, "v1", "RoleBinding", "rolebindings", "rolebinding", True),
    # CRDs applied with kubectl register their kind (sim/apiserver/crds.py).
    ResourceType(
        CRD_GROUP,
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        "customresourcedefinition",
        False,
        ("crd", "crds"),
        ("api-extensions",),
        subresources=_STATUS,
    ),
    ResourceType(
        KARPENTER_GROUP,
        KARPENTER_VERSION,
        "NodePool",
        "nodepools",
        "nodepool",
        False,
        categories=("karpenter",),
        subresources=_STATUS,
        custom=True,
        generation=True,
    ),
    ResourceType(
        KARPENTER_GROUP,
        KARPENTER_VERSION,
        "NodeClaim",
        "nodeclaims",
        "nodeclaim",
        False,
        categories=("karpenter",),
        subresources=_STATUS,
        custom=True,
        generation=True,
    ),
    # Karpenter's NodeOverlay (v1.7, alpha): validated by its bundled CRD (karpenter_crds/).
    ResourceType(
        KARPENTER_GROUP,
        "v1alpha1",
        "NodeOverlay",
        "nodeoverlays",
        "nodeoverlay",
        False,
        ("overlays",),
        ("karpenter",),
        subresources=_STATUS,
        custom=True,
        generation=True,
    ),
    ResourceType(
        AWS_GROUP,
        AWS_VERSION,
        "EC2NodeClass",
        "ec2nodeclasses",
        "ec2nodeclass",
        False,
        ("ec2nc", "ec2ncs"),
        ("karpenter",),
        subresources=_STATUS,
        custom=True,
        generation=True,
    ),
)

_BY_NAME: dict[str, ResourceType] = {}
for _r in RESOURCES:
    for _name in (_r.plural, _r.singular, _r.kind, _r.kind.lower(), _r.group_resource, *_r.short_names):
        _BY_NAME.setdefault(_name, _r)
_BY_GVR: dict[tuple[str, str, str], ResourceType] = {(r.group, r.version, r.plural): r for r in RESOURCES}


class UnknownResource(LookupError):
    pass


# Types registered from CustomResourceDefinitions, by (group, plural). Module state like the table
# above: one emulator runs per process (SimStack enforces it), and a new ApiServer clears it.
_REGISTERED: dict[tuple[str, str], ResourceType] = {}


def _names(r: ResourceType) -> tuple[str, ...]:
    return (r.plural, r.singular, r.kind, r.kind.lower(), r.group_resource, *r.short_names)


def resolve(resource: str | ResourceType) -> ResourceType:
    """Find a resource type by plural, singular, Kind, short name or `plural.group`."""
    if isinstance(resource, ResourceType):
        return resource
    found = _BY_NAME.get(resource)
    if found is None:
        found = next((r for r in _REGISTERED.values() if resource in _names(r)), None)
    if found is None:
        raise UnknownResource(f"the emulator serves no resource named {resource!r}")
    return found


def by_gvr(group: str, version: str, plural: str) -> ResourceType | None:
    found = _BY_GVR.get((group, version, plural))
    if found is None and (registered := _REGISTERED.get((group, plural))) is not None:
        return registered if registered.version == version else None
    return found


def groups() -> dict[str, list[ResourceType]]:
    """Resource types by API group, in registry order (the core group is "")."""
    out: dict[str, list[ResourceType]] = {}
    for r in all_resources():
        out.setdefault(r.group, []).append(r)
    return out


def all_resources() -> tuple[ResourceType, ...]:
    return (*RESOURCES, *_REGISTERED.values())


def is_builtin(group: str, plural: str) -> bool:
    return any(r.group == group and r.plural == plural for r in RESOURCES)


def registered() -> dict[tuple[str, str], ResourceType]:
    return dict(_REGISTERED)


def register(rt: ResourceType) -> None:
    if is_builtin(rt.group, rt.plural):
        raise ValueError(f"{rt.group_resource} is built in")
    _REGISTERED[(rt.group, rt.plural)] = rt


def unregister(group: str, plural: str) -> ResourceType | None:
    return _REGISTERED.pop((group, plural), None)


def clear_registered() -> None:
    _REGISTERED.clear()
