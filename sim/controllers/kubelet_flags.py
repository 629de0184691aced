"""Kubelet flag syntax for node labels and taints, as carried by a launched instance's tags.

`--node-labels=k=v,k2=v2` and `--register-with-taints=key=value:Effect,key2:Effect` are what a
real launch passes to the kubelet through user data; the simulator reads the same strings from the
instance tags `api.constants.TAG_NODE_LABELS`, `TAG_NODE_TAINTS` and `TAG_STARTUP_TAINTS`.
Both directions live here so launchers and the simulator cannot disagree on the syntax.
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


def format_node_labels(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def format_taints(taints: Iterable[Mapping[str, Any]]) -> str:
    parts = []
    for taint in taints:
        value = taint.get("value")
        key = f"{taint['key']}={value}" if value else str(taint["key"])
        parts.append(f"{key}:{taint['effect']}")
    return ",".join(parts)
