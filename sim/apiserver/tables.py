"""Server-side printing: the `meta.k8s.io/v1 Table` kubectl asks for on `get`.

kubectl 1.32 prints what the server renders (`Accept: application/json;as=Table;g=meta.k8s.io;
v=v1`), so `kubectl get nodes -o wide` shows STATUS, ROLES, INTERNAL-IP... only if the server
computes them. Columns follow kube-apiserver's printers for the built-in types; other built-in kinds
get NAME and AGE. Columns with priority 1 or more are the `-o wide` ones.

A custom resource's columns are its CRD's `additionalPrinterColumns` (Karpenter's bundled CRDs for
the kinds served natively), as apiextensions-apiserver's table convertor renders them
(staging/src/k8s.io/apiextensions-apiserver/pkg/registry/customresource/tableconvertor/
tableconvertor.go): NAME first, then each column in the CRD's order with its type, format,
priority and description (by default "Custom resource definition column (in JSONPath format):
<path>"); only Age (`.metadata.creationTimestamp`) when the CRD names none. A cell is the first
value the column's jsonPath finds (jsonpath.py), none (null) when it finds nothing; a `string`
column prints it as kubectl's JSONPath does (lists and maps as JSON), `integer`, `number` and
`boolean` keep the JSON value of that type, `date` becomes the time since it (`5m`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sim.apiserver import crds, jsonpath
from sim.apiserver.resources import ResourceType

Column = tuple[str, str, int, Callable[[dict[str, Any]], Any]]  # name, type, priority, cell


@dataclass(frozen=True)
class ColumnDefinition:
    """One column of a Table: its `TableColumnDefinition` and how a cell is computed."""

    name: str
    type: str
    priority: int
    cell: Callable[[dict[str, Any]], Any]
    format: str = ""
    description: str = ""


def human_duration(seconds: float) -> str:
    """kube's duration.HumanDuration, enough for AGE columns."""
    s = int(seconds)
    if s < 0:
        return "<invalid>"
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = s // 3600
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    d = h // 24
    if d < 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    if d < 365 * 2:
        return f"{d}d"
    return f"{d // 365}y"


def _age(obj: dict[str, Any]) -> str:
    ts = (obj.get("metadata") or {}).get("creationTimestamp")
    if not ts:
        return "<unknown>"
    then = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    return human_duration((datetime.now(UTC) - then).total_seconds())


def _name(obj: dict[str, Any]) -> str:
    return (obj.get("metadata") or {}).get("name", "")


def _dig(obj: Any, *path: str, default: Any = "<none>") -> Any:
    for p in path:
        if not isinstance(obj, dict) or p not in obj:
            return default
        obj = obj[p]
    return obj


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for c in _dig(obj, "status", "conditions", default=[]) or []:
        if c.get("type") == kind:
            return c
    return None


# --- nodes ---------------------------------------------------------------------------------------


def _node_status(node: dict[str, Any]) -> str:
    ready = _condition(node, "Ready")
    text = (
        "Unknown"
        if ready is None or ready.get("status") == "Unknown"
        else ("Ready" if ready.get("status") == "True" else "NotReady")
    )
    if _dig(node, "spec", "unschedulable", default=False):
        text += ",SchedulingDisabled"
    return text


def _node_roles(node: dict[str, Any]) -> str:
    roles = set()
    for key, value in (_dig(node, "metadata", "labels", default={}) or {}).items():
        if key.startswith("node-role.kubernetes.io/"):
            roles.add(key.split("/", 1)[1])
        elif key == "kubernetes.io/role":
            roles.add(value)
    return ",".join(sorted(r for r in roles if r)) or "<none>"


def _address(node: dict[str, Any], kind: str) -> str:
    for a in _dig(node, "status", "addresses", default=[]) or []:
        if a.get("type") == kind:
            return a.get("address", "<none>")
    return "<none>"


_NODE: list[Column] = [
    ("Name", "string", 0, _name),
    ("Status", "string", 0, _node_status),
    ("Roles", "string", 0, _node_roles),
    ("Age", "string", 0, _age),
    ("Version", "string", 0, lambda n: _dig(n, "status", "nodeInfo", "kubeletVersion", default="")),
    ("Internal-IP", "string", 1, lambda n: _address(n, "InternalIP")),
    ("External-IP", "string", 1, lambda n: _address(n, "ExternalIP")),
    ("OS-Image", "string", 1, lambda n: _dig(n, "status", "nodeInfo", "osImage", default="<unknown>")),
    (
        "Kernel-Version",
        "string",
        1,
        lambda n: _dig(n, "status", "nodeInfo", "kernelVersion", default="<unknown>"),
    ),
    (
        "Container-Runtime",
        "string",
        1,
        lambda n: _dig(n, "status", "nodeInfo", "containerRuntimeVersion", default="<unknown>"),
    ),
]


# --- pods ----------------------------------------------------------------------------------------


def _pod_ready(pod: dict[str, Any]) -> str:
    containers = _dig(pod, "spec", "containers", default=[]) or []
    statuses = _dig(pod, "status", "containerStatuses", default=[]) or []
    return f"{sum(1 for s in statuses if s.get('ready'))}/{len(containers)}"


def _pod_status(pod: dict[str, Any]) -> str:
    if _dig(pod, "metadata", "deletionTimestamp", default=None):
        return "Terminating"
    reason = _dig(pod, "status", "reason", default=None)
    if reason:
        return reason
    for s in _dig(pod, "status", "containerStatuses", default=[]) or []:
        waiting = _dig(s, "state", "waiting", "reason", default=None)
        if waiting:
            return waiting
    return _dig(pod, "status", "phase", default="Unknown")


def _restarts(pod: dict[str, Any]) -> int:
    return sum(
        int(s.get("restartCount", 0)) for s in _dig(pod, "status", "containerStatuses", default=[]) or []
    )


_POD: list[Column] = [
    ("Name", "string", 0, _name),
    ("Ready", "string", 0, _pod_ready),
    ("Status", "string", 0, _pod_status),
    ("Restarts", "string", 0, lambda p: str(_restarts(p))),
    ("Age", "string", 0, _age),
    ("IP", "string", 1, lambda p: _dig(p, "status", "podIP")),
    ("Node", "string", 1, lambda p: _dig(p, "spec", "nodeName")),
    ("Nominated Node", "string", 1, lambda p: _dig(p, "status", "nominatedNodeName")),
    ("Readiness Gates", "string", 1, lambda p: "<none>"),
]


# --- the rest ------------------------------------------------------------------------------------


def _int_or(obj: dict[str, Any], *path: str) -> str:
    value = _dig(obj, *path, default=None)
    return "N/A" if value is None else str(value)


_COLUMNS: dict[str, list[Column]] = {
    "Node": _NODE,
    "Pod": _POD,
    "Namespace": [
        ("Name", "string", 0, _name),
        ("Status", "string", 0, lambda n: _dig(n, "status", "phase", default="")),
        ("Age", "string", 0, _age),
    ],
    "Deployment": [
        ("Name", "string", 0, _name),
        (
            "Ready",
            "string",
            0,
            lambda d: (
                f"{_dig(d, 'status', 'readyReplicas', default=0)}/{_dig(d, 'spec', 'replicas', default=0)}"
            ),
        ),
        ("Up-to-date", "integer", 0, lambda d: _dig(d, "status", "updatedReplicas", default=0)),
        ("Available", "integer", 0, lambda d: _dig(d, "status", "availableReplicas", default=0)),
        ("Age", "string", 0, _age),
    ],
    "ReplicaSet": [
        ("Name", "string", 0, _name),
        ("Desired", "integer", 0, lambda r: _dig(r, "spec", "replicas", default=0)),
        ("Current", "integer", 0, lambda r: _dig(r, "status", "replicas", default=0)),
        ("Ready", "integer", 0, lambda r: _dig(r, "status", "readyReplicas", default=0)),
        ("Age", "string", 0, _age),
    ],
    "DaemonSet": [
        ("Name", "string", 0, _name),
        ("Desired", "integer", 0, lambda d: _dig(d, "status", "desiredNumberScheduled", default=0)),
        ("Current", "integer", 0, lambda d: _dig(d, "status", "currentNumberScheduled", default=0)),
        ("Ready", "integer", 0, lambda d: _dig(d, "status", "numberReady", default=0)),
        ("Up-to-date", "integer", 0, lambda d: _dig(d, "status", "updatedNumberScheduled", default=0)),
        ("Available", "integer", 0, lambda d: _dig(d, "status", "numberAvailable", default=0)),
        (
            "Node Selector",
            "string",
            0,
            lambda d: (
                ",".join(
                    f"{k}={v}"
                    for k, v in (
                        _dig(d, "spec", "template", "spec", "nodeSelector", default={}) or {}
                    ).items()
                )
                or "<none>"
            ),
        ),
        ("Age", "string", 0, _age),
    ],
    "PodDisruptionBudget": [
        ("Name", "string", 0, _name),
        ("Min Available", "string", 0, lambda p: _int_or(p, "spec", "minAvailable")),
        ("Max Unavailable", "string", 0, lambda p: _int_or(p, "spec", "maxUnavailable")),
        ("Allowed Disruptions", "integer", 0, lambda p: _dig(p, "status", "disruptionsAllowed", default=0)),
        ("Age", "string", 0, _age),
    ],
    "Lease": [
        ("Name", "string", 0, _name),
        ("Holder", "string", 0, lambda lease: _dig(lease, "spec", "holderIdentity", default="")),
        ("Age", "string", 0, _age),
    ],
    "Event": [
        (
            "Last Seen",
            "string",
            0,
            lambda e: _age(
                {
                    "metadata": {
                        "creationTimestamp": e.get("lastTimestamp")
                        or _dig(e, "metadata", "creationTimestamp")
                    }
                }
            ),
        ),
        ("Type", "string", 0, lambda e: e.get("type", "")),
        ("Reason", "string", 0, lambda e: e.get("reason", "")),
        (
            "Object",
            "string",
            0,
            lambda e: (
                f"{_dig(e, 'involvedObject', 'kind', default='').lower()}/"
                f"{_dig(e, 'involvedObject', 'name', default='')}"
            ),
        ),
        ("Message", "string", 0, lambda e: e.get("message", "")),
    ],
}
_GENERIC: list[Column] = [("Name", "string", 0, _name), ("Age", "string", 0, _age)]


def _parse_time(text: str) -> datetime | None:
    try:
        then = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return then if then.tzinfo is not None else then.replace(tzinfo=UTC)


def json_cell(column_type: str, value: Any) -> Any:
    """`cellForJSONValue`: a non-string column's cell from the JSON value found (None: nothing)."""
    if column_type == "integer":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float):
            return int(value)
    elif column_type == "number":
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif column_type == "boolean":
        if isinstance(value, bool):
            return value
    elif column_type == "string":
        if isinstance(value, str):
            return value
    elif column_type == "date" and isinstance(value, str):
        then = _parse_time(value)
        if then is None:
            return "<invalid>"
        return human_duration((datetime.now(UTC) - then).total_seconds())
    return None


def _crd_cell(column_type: str, path: str) -> Callable[[dict[str, Any]], Any]:
    steps = jsonpath.parse(path)

    def cell(obj: dict[str, Any]) -> Any:
        values: list[Any] = [obj]
        for step in steps:
            values = step(values)
        if not values:
            return None
        value = values[0]  # "as we only support simple JSON path", the first result
        if column_type == "string":
            return None if value is None else jsonpath.text(value)
        return json_cell(column_type, value)

    return cell


def crd_columns(columns: tuple[Mapping[str, Any], ...]) -> list[ColumnDefinition]:
    """A custom resource's columns from its CRD's additionalPrinterColumns (`tableconvertor.New`:
    a column whose jsonPath does not parse ends the list there, as a default convertor would)."""
    out = [ColumnDefinition("Name", "string", 0, _name, format="name")]
    for column in columns:
        path = str(column.get("jsonPath") or "")
        try:
            cell = _crd_cell(str(column.get("type") or "string"), path)
        except ValueError:
            break
        out.append(
            ColumnDefinition(
                str(column.get("name") or ""),
                str(column.get("type") or "string"),
                int(column.get("priority") or 0),
                cell,
                format=str(column.get("format") or ""),
                description=str(
                    column.get("description")
                    or f"Custom resource definition column (in JSONPath format): {path}"
                ),
            )
        )
    return out


def columns_for(rt: ResourceType) -> list[ColumnDefinition]:
    custom = crds.printer_columns_for(rt)
    if custom is not None:
        return crd_columns(custom)
    return [
        ColumnDefinition(name, typ, prio, fn, format="name" if name == "Name" else "")
        for name, typ, prio, fn in _COLUMNS.get(rt.kind, _GENERIC)
    ]


def _row_object(obj: dict[str, Any], include: str) -> dict[str, Any] | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata", {}),
    }


def table(
    rt: ResourceType,
    objects: list[dict[str, Any]],
    *,
    resource_version: str = "",
    continue_token: str | None = None,
    include_object: str = "PartialObjectMetadata",
    remaining: int | None = None,
) -> dict[str, Any]:
    cols = columns_for(rt)
    definitions = [
        {
            "name": c.name,
            "type": c.type,
            "format": c.format,
            "description": c.description,
            "priority": c.priority,
        }
        for c in cols
    ]
    custom = rt.custom
    rows = []
    for obj in objects:
        row: dict[str, Any] = {"cells": [_cell(c.cell, obj, custom) for c in cols]}
        row_obj = _row_object(obj, include_object)
        if row_obj is not None:
            row["object"] = row_obj
        rows.append(row)
    meta: dict[str, Any] = {"resourceVersion": resource_version}
    if continue_token:
        meta["continue"] = continue_token
    if remaining is not None:
        meta["remainingItemCount"] = remaining
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": definitions,
        "rows": rows,
    }


def _cell(fn: Callable[[dict[str, Any]], Any], obj: dict[str, Any], custom: bool) -> Any:
    try:
        value = fn(obj)
    except (AttributeError, KeyError, TypeError, ValueError):
        return "<unknown>"
    if value is None and not custom:
        return "<none>"  # the built-in printers' word; a custom resource's empty cell is null
    return value


def wants_table(accept: str) -> bool:
    """True when the first acceptable media type in Accept is a meta.k8s.io Table."""
    for part in accept.split(","):
        bits = [b.strip() for b in part.split(";")]
        params = dict(b.split("=", 1) for b in bits[1:] if "=" in b)
        if params.get("as") == "Table" and params.get("g") == "meta.k8s.io":
            return params.get("v") in ("v1", "v1beta1")
        if bits[0]:
            return False
    return False
