"""Kubelet flag syntax for node labels and taints, and the labels a kubelet refuses to start with.

`--node-labels=k=v,k2=v2` and `--register-with-taints=key=value:Effect,key2:Effect` are what a
real launch passes to the kubelet through user data (sim/controllers/bootstrap.py reads them from
nodeadm's flags, bootstrap.sh's `--kubelet-extra-args` and Bottlerocket's settings). Both
directions live here so the simulator's launchers and its reader cannot disagree on the syntax.
`refused_node_labels` is the kubelet's own check of the labels' keys, the simulator's version of it
(karpflow's is launch/kubelet_labels.py: the referee does not share it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sim.apiserver.selectors import label_key_error, label_value_error

TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


class FlagSyntaxError(ValueError):
    """A label or taint string that the kubelet would refuse."""


def _check_key(key: str, what: str, source: str) -> None:
    if label_key_error(key) is not None:
        raise FlagSyntaxError(f"{source}: invalid {what} key {key!r}")


def _check_value(value: str, what: str, key: str, source: str) -> None:
    if label_value_error(value) is not None:
        raise FlagSyntaxError(f"{source}: invalid {what} value {value!r} for key {key!r}")


def parse_node_labels(text: str | None, source: str = "--node-labels") -> dict[str, str]:
    """`k=v,k2=v2` → {"k": "v", "k2": "v2"}. Empty or None → {}."""
    labels: dict[str, str] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise FlagSyntaxError(f"{source}: label {item!r} is not key=value")
        key, value = key.strip(), value.strip()
        _check_key(key, "label", source)
        _check_value(value, "label", key, source)
        labels[key] = value
    return labels


def parse_taints(text: str | None, source: str = "--register-with-taints") -> list[dict[str, str]]:
    """`key=value:Effect,key2:Effect` → Kubernetes taint dicts (value omitted when empty)."""
    taints: list[dict[str, str]] = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        body, sep, effect = item.rpartition(":")
        if not sep or not body:
            raise FlagSyntaxError(f"{source}: taint {item!r} is not key[=value]:Effect")
        if effect not in TAINT_EFFECTS:
            raise FlagSyntaxError(
                f"{source}: taint {item!r} has effect {effect!r}, not one of {', '.join(TAINT_EFFECTS)}"
            )
        key, _, value = body.partition("=")
        _check_key(key, "taint", source)
        _check_value(value, "taint", key, source)
        taint = {"key": key, "effect": effect}
        if value:
            taint["value"] = value
        taints.append(taint)
    return taints


# What a kubelet checks in --node-labels before it starts (kubernetes/kubernetes
# cmd/kubelet/app/options/options.go `ValidateKubeletFlags`, with `IsKubeletLabel` of
# staging/src/k8s.io/kubelet/pkg/apis/well_known_labels.go): a key prefixed by a domain ending in
# kubernetes.io or k8s.io must be one the kubelet sets on its own Node, or it exits.
_GUARDED_DOMAINS = (("kubernetes", "io"), ("k8s", "io"))
_SELF_SET_DOMAINS = (("kubelet", "kubernetes", "io"), ("node", "kubernetes", "io"))
_SELF_SET_KEYS = frozenset(
    {
        "kubernetes.io/hostname",
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region",
    }
)


def _in_domain(parts: tuple[str, ...], domain: tuple[str, ...]) -> bool:
    return parts[-len(domain) :] == domain


def refused_node_labels(keys: Iterable[str]) -> list[str]:
    """The label keys a kubelet refuses to start with, sorted (none: it starts)."""
    refused: set[str] = set()
    for key in keys:
        prefix, slash, _ = key.rpartition("/")
        parts = tuple(prefix.split(".")) if slash else ()
        guarded = any(_in_domain(parts, d) for d in _GUARDED_DOMAINS)
        if guarded and key not in _SELF_SET_KEYS and not any(_in_domain(parts, d) for d in _SELF_SET_DOMAINS):
            refused.add(key)
    return sorted(refused)


def format_node_labels(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def format_taints(taints: Iterable[Mapping[str, Any]]) -> str:
    parts = []
    for taint in taints:
        value = taint.get("value")
        key = f"{taint['key']}={value}" if value else str(taint["key"])
        parts.append(f"{key}:{taint['effect']}")
    return ",".join(parts)
