"""The user data the simulated Karpenter launches an instance with, per AMI family, as Karpenter's AWS
provider writes it (aws/karpenter-provider-aws pkg/providers/amifamily/bootstrap), in the simulator's
own words: the simulator's bootstrap reader (sim/controllers/bootstrap.py) then registers the Node.

- AL2023 (nodeadm): a MIME archive, the EC2NodeClass's own user data parts first, then Karpenter's
  NodeConfig: cluster name, endpoint, CA and service CIDR; the kubelet configuration with maxPods and
  `registerWithTaints` (the NodeClaim's taints and startup taints, plus `karpenter.sh/unregistered`);
  the NodeClaim's labels as `--node-labels`.
- Bottlerocket: TOML `settings.kubernetes`, the class's settings merged under Karpenter's.
- AL2: a shell script calling bootstrap.sh with the labels, taints and max pods as kubelet flags.
- Custom: the class's user data as it is (the user bootstraps the node).

Every family leaves out the NodeClaim's labels under `kubernetes.io`, `k8s.io` and
`node-restriction.kubernetes.io` and their subdomains (Karpenter's `RejectForbiddenLabels`,
pkg/providers/amifamily/resolver.go): the kubelet could refuse them, and Karpenter's registration
writes them on the Node (sim/controllers/karpenter/nodeclaims.py).
"""

from __future__ import annotations

import email
import ipaddress
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from api.constants import UNREGISTERED_TAINT_KEY
from sim.controllers.kubelet_flags import format_node_labels, format_taints

BOUNDARY = "//"
UNREGISTERED_TAINT = {"key": UNREGISTERED_TAINT_KEY, "effect": "NoExecute"}


@dataclass(frozen=True)
class ClusterBootstrap:
    """What Karpenter knows of the cluster from its settings and DescribeCluster."""

    name: str
    endpoint: str
    ca_bundle: str  # base64 PEM
    service_cidr: str


def ami_family(nodeclass: Mapping[str, Any]) -> str:
    """AL2023, Bottlerocket, AL2 or Custom: `amiFamily`, else the family of the first alias."""
    spec = nodeclass.get("spec") or {}
    if spec.get("amiFamily"):
        return str(spec["amiFamily"])
    for term in spec.get("amiSelectorTerms") or ():
        alias = str(term.get("alias") or "")
        if alias:
            return {"al2023": "AL2023", "al2": "AL2", "bottlerocket": "Bottlerocket"}.get(
                alias.split("@", 1)[0].lower(), "Custom"
            )
    return "Custom"


def _dns(cluster: ClusterBootstrap) -> str:
    return str(ipaddress.ip_network(cluster.service_cidr, strict=False).network_address + 10)


# Karpenter drops every label under these domains from user data, the kubelet's own ones too.
_NOT_IN_USER_DATA = ("node-restriction.kubernetes.io", "kubernetes.io", "k8s.io")


def _in_user_data(key: str) -> bool:
    domain = key.split("/", 1)[0] if "/" in key else ""
    return not any(domain == d or domain.endswith("." + d) for d in _NOT_IN_USER_DATA)


def user_data(
    family: str,
    cluster: ClusterBootstrap,
    labels: Mapping[str, str],
    taints: list[Mapping[str, Any]],
    max_pods: int | None,
    custom: str | None,
) -> str:
    """What the instance boots with. `taints` are the NodeClaim's taints and startup taints."""
    registered = [UNREGISTERED_TAINT, *taints]
    labels = {key: value for key, value in labels.items() if _in_user_data(key)}
    if family == "Custom":
        return custom or ""
    if family == "Bottlerocket":
        return _bottlerocket(cluster, labels, registered, max_pods, custom)
    if family == "AL2":
        return _al2(cluster, labels, registered, max_pods, custom)
    return _al2023(cluster, labels, registered, max_pods, custom)


def _al2023(
    cluster: ClusterBootstrap,
    labels: Mapping[str, str],
    taints: list[Mapping[str, Any]],
    max_pods: int | None,
    custom: str | None,
) -> str:
    kubelet: dict[str, Any] = {"registerWithTaints": [dict(t) for t in taints]}
    if max_pods is not None:
        kubelet["maxPods"] = max_pods
    config = {
        "apiVersion": "node.eks.aws/v1alpha1",
        "kind": "NodeConfig",
        "spec": {
            "cluster": {
                "name": cluster.name,
                "apiServerEndpoint": cluster.endpoint,
                "certificateAuthority": cluster.ca_bundle,
                "cidr": cluster.service_cidr,
            },
            "kubelet": {"config": kubelet, "flags": [f"--node-labels={format_node_labels(labels)}"]},
        },
    }
    parts = _custom_parts(custom)
    parts.append(("application/node.eks.aws", "# Karpenter Generated NodeConfig\n" + yaml.safe_dump(config)))
    body = [f'MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="{BOUNDARY}"\n']
    for content_type, content in parts:
        body.append(f"--{BOUNDARY}\nContent-Type: {content_type}\n\n{content.rstrip()}\n")
    body.append(f"--{BOUNDARY}--\n")
    return "\n".join(body)


def _custom_parts(custom: str | None) -> list[tuple[str, str]]:
    """The class's user data as MIME parts: its own parts, or one NodeConfig or shell part."""
    text = (custom or "").strip()
    if not text:
        return []
    if text.startswith(("MIME-Version", "Content-Type")):
        message = email.message_from_string(text)
        out = []
        for part in message.walk():
            if part.is_multipart():
                continue
            payload = part.get_payload(decode=True)
            content = payload.decode() if isinstance(payload, bytes) else str(part.get_payload())
            out.append((part.get_content_type(), content))
        return out
    if text.startswith("#!"):
        return [("text/x-shellscript", text)]
    return [("application/node.eks.aws", text)]


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _bottlerocket(
    cluster: ClusterBootstrap,
    labels: Mapping[str, str],
    taints: list[Mapping[str, Any]],
    max_pods: int | None,
    custom: str | None,
) -> str:
    settings = tomllib.loads(custom).get("settings", {}) if custom else {}
    kube = dict(settings.get("kubernetes") or {})
    kube.update(
        {
            "cluster-name": cluster.name,
            "api-server": cluster.endpoint,
            "cluster-certificate": cluster.ca_bundle,
            "cluster-dns-ip": _dns(cluster),
        }
    )
    if max_pods is not None:
        kube["max-pods"] = max_pods
    node_labels = {**(kube.pop("node-labels", None) or {}), **labels}
    node_taints: dict[str, list[str]] = dict(kube.pop("node-taints", None) or {})
    for taint in taints:
        entry = f"{taint.get('value') or ''}:{taint['effect']}"
        node_taints.setdefault(str(taint["key"]), []).append(entry)
    lines = ["[settings.kubernetes]"]
    lines += [f'"{key}" = {_toml_value(value)}' for key, value in kube.items() if not isinstance(value, dict)]
    lines.append("[settings.kubernetes.node-labels]")
    lines += [f'"{key}" = {_toml_value(value)}' for key, value in sorted(node_labels.items())]
    lines.append("[settings.kubernetes.node-taints]")
    lines += [f'"{key}" = {_toml_value(values)}' for key, values in sorted(node_taints.items())]
    return "\n".join(lines) + "\n"


def _al2(
    cluster: ClusterBootstrap,
    labels: Mapping[str, str],
    taints: list[Mapping[str, Any]],
    max_pods: int | None,
    custom: str | None,
) -> str:
    flags = [f"--node-labels={format_node_labels(labels)}", f"--register-with-taints={format_taints(taints)}"]
    if max_pods is not None:
        flags.append(f"--max-pods={max_pods}")
    script = (
        "#!/bin/bash -xe\n"
        f"/etc/eks/bootstrap.sh '{cluster.name}' --apiserver-endpoint '{cluster.endpoint}' "
        f"--b64-cluster-ca '{cluster.ca_bundle}' --dns-cluster-ip '{_dns(cluster)}' "
        f"--use-max-pods false --kubelet-extra-args '{' '.join(flags)}'\n"
    )
    return (custom.rstrip() + "\n" + script) if custom else script
