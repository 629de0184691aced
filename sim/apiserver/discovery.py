"""Discovery documents: /version, /api, /apis and the per group-version resource lists.

Both forms kube-apiserver 1.32 serves are here: the legacy documents (APIVersions, APIGroupList,
APIResourceList) and aggregated discovery (apidiscovery.k8s.io/v2 APIGroupDiscoveryList), which
kubectl asks for first and which saves it one request per group version.
"""

from __future__ import annotations

from typing import Any

from sim.apiserver.resources import ResourceType, groups

AGGREGATED_CONTENT_TYPE = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"

VERSION_INFO = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-karpflow-emulator",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-01-01T00:00:00Z",
    "goVersion": "go1.23.4",
    "compiler": "gc",
    "platform": "linux/amd64",
}

_SUBRESOURCE_VERBS = {
    "status": ["get", "patch", "update"],
    "eviction": ["create"],
    "binding": ["create"],
    "token": ["create"],
}
_SUBRESOURCE_KIND = {
    "eviction": ("policy", "v1", "Eviction"),
    "binding": ("", "v1", "Binding"),
    "token": ("authentication.k8s.io", "v1", "TokenRequest"),
}


def api_versions(server_address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def _group_doc(name: str, rts: list[ResourceType]) -> dict[str, Any]:
    versions = sorted({rt.version for rt in rts})
    gvs = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"kind": "APIGroup", "apiVersion": "v1", "name": name, "versions": gvs, "preferredVersion": gvs[0]}


def api_group_list() -> dict[str, Any]:
    docs = [_group_doc(name, rts) for name, rts in groups().items() if name]
    for doc in docs:
        del doc["kind"], doc["apiVersion"]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": docs}


def api_group(name: str) -> dict[str, Any] | None:
    rts = groups().get(name)
    return _group_doc(name, rts) if rts and name else None


def resource_list(group: str, version: str) -> dict[str, Any] | None:
    rts = [rt for rt in groups().get(group, []) if rt.version == version]
    if not rts:
        return None
    resources: list[dict[str, Any]] = []
    for rt in rts:
        entry: dict[str, Any] = {
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": rt.verbs,
        }
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.categories:
            entry["categories"] = list(rt.categories)
        resources.append(entry)
        for sub in rt.subresources:
            sub_group, sub_version, sub_kind = _SUBRESOURCE_KIND.get(sub, (rt.group, rt.version, rt.kind))
            sub_entry: dict[str, Any] = {
                "name": f"{rt.plural}/{sub}",
                "singularName": "",
                "namespaced": rt.namespaced,
                "kind": sub_kind,
                "verbs": _SUBRESOURCE_VERBS[sub],
            }
            if sub in _SUBRESOURCE_KIND:
                sub_entry["group"], sub_entry["version"] = sub_group, sub_version
            resources.append(sub_entry)
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}


def _aggregated_resource(rt: ResourceType) -> dict[str, Any]:
    out: dict[str, Any] = {
        "resource": rt.plural,
        "responseKind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
        "scope": "Namespaced" if rt.namespaced else "Cluster",
        "singularResource": rt.singular,
        "verbs": rt.verbs,
    }
    if rt.short_names:
        out["shortNames"] = list(rt.short_names)
    if rt.categories:
        out["categories"] = list(rt.categories)
    subs = []
    for sub in rt.subresources:
        group, version, kind = _SUBRESOURCE_KIND.get(sub, (rt.group, rt.version, rt.kind))
        subs.append(
            {
                "subresource": sub,
                "responseKind": {"group": group, "version": version, "kind": kind},
                "verbs": _SUBRESOURCE_VERBS[sub],
            }
        )
    if subs:
        out["subresources"] = subs
    return out


def aggregated(core: bool) -> dict[str, Any]:
    """The APIGroupDiscoveryList for /api (core=True) or /apis."""
    items = []
    for name, rts in groups().items():
        if (name == "") != core:
            continue
        by_version: dict[str, list[ResourceType]] = {}
        for rt in rts:
            by_version.setdefault(rt.version, []).append(rt)
        versions = [
            {"version": v, "resources": [_aggregated_resource(rt) for rt in vrts], "freshness": "Current"}
            for v, vrts in sorted(by_version.items())
        ]
        items.append({"metadata": {"name": name} if name else {}, "versions": versions})
    return {
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": items,
    }


def wants_aggregated(accept: str) -> bool:
    """True when the Accept header asks for apidiscovery v2 before anything else it accepts."""
    for part in accept.split(","):
        params = {p.split("=", 1)[0].strip(): p.split("=", 1)[-1].strip() for p in part.split(";")[1:]}
        if params.get("as") == "APIGroupDiscoveryList":
            if params.get("g") == "apidiscovery.k8s.io" and params.get("v") == "v2":
                return True
            continue
        if part.strip():
            return False
    return False
