"""Bootstrap user data per AMI family, merged with the EC2NodeClass's own user data.

Follows Karpenter's AWS provider: AL2023 gets a MIME multi-part document whose last part is a
nodeadm NodeConfig (the user's parts come first, so ours wins where both set a value); Bottlerocket
gets TOML where karpflow's `settings.kubernetes` cluster keys override the user's; AL2 gets
/etc/eks/bootstrap.sh; Custom is left exactly as the user wrote it.
"""

from __future__ import annotations

import email
import ipaddress
import tomllib
from dataclasses import dataclass, field
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from typing import Any

import yaml

UNREGISTERED_TAINT = "karpenter.sh/unregistered:NoExecute"
NODEPOOL_LABEL = "karpenter.sh/nodepool"
BOUNDARY = "//"


@dataclass(frozen=True)
class ClusterInfo:
    name: str
    endpoint: str
    ca_bundle: str  # base64 PEM, as DescribeCluster returns it
    service_cidr: str = "10.100.0.0/16"


@dataclass(frozen=True)
class NodeBootstrap:
    nodepool: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[str] = field(default_factory=list)  # kubelet syntax key=value:Effect
    startup_taints: list[str] = field(default_factory=list)
    kubelet: dict[str, Any] = field(default_factory=dict)  # EC2NodeClass spec.kubelet

    def all_labels(self) -> dict[str, str]:
        return {**self.labels, NODEPOOL_LABEL: self.nodepool}

    def all_taints(self) -> list[str]:
        return [*self.taints, *self.startup_taints, UNREGISTERED_TAINT]


def _labels_flag(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def generate(family: str | None, cluster: ClusterInfo, node: NodeBootstrap, user_data: str | None) -> str:
    family = (family or "AL2023").lower()
    if family == "custom":
        return user_data or ""
    if family == "al2023":
        return al2023(cluster, node, user_data)
    if family == "bottlerocket":
        return bottlerocket(cluster, node, user_data)
    if family == "al2":
        return al2(cluster, node, user_data)
    raise ValueError(f"unsupported amiFamily {family!r}")


# --- AL2023 -------------------------------------------------------------------------------------


def _nodeconfig(cluster: ClusterInfo, node: NodeBootstrap) -> dict[str, Any]:
    config: dict[str, Any] = dict(node.kubelet)
    flags = [
        f"--node-labels={_labels_flag(node.all_labels())}",
        f"--register-with-taints={','.join(node.all_taints())}",
    ]
    return {
        "apiVersion": "node.eks.aws/v1alpha1",
        "kind": "NodeConfig",
        "spec": {
            "cluster": {
                "name": cluster.name,
                "apiServerEndpoint": cluster.endpoint,
                "certificateAuthority": cluster.ca_bundle,
                "cidr": cluster.service_cidr,
            },
            "kubelet": {"config": config, "flags": flags},
        },
    }


def _user_parts(user_data: str | None) -> list[tuple[str, str]]:
    """(content type, payload) of each part of the user's user data; a plain script is one part."""
    if not user_data or not user_data.strip():
        return []
    if user_data.lstrip().startswith("MIME-Version"):
        message = email.message_from_string(user_data)
        if not message.is_multipart():
            raise ValueError("userData is a MIME document but not multipart")
        return [
            (part.get_content_type(), part.get_payload(decode=True).decode())
            for part in message.walk()
            if not part.is_multipart()
        ]
    if user_data.lstrip().startswith(("apiVersion", "---")):
        return [("application/node.eks.aws", user_data)]
    return [("text/x-shellscript", user_data)]


def al2023(cluster: ClusterInfo, node: NodeBootstrap, user_data: str | None) -> str:
    message = MIMEMultipart(boundary=BOUNDARY)
    parts = [
        *_user_parts(user_data),
        ("application/node.eks.aws", yaml.safe_dump(_nodeconfig(cluster, node))),
    ]
    for content_type, payload in parts:
        part = MIMEText(payload, _subtype=content_type.split("/", 1)[1])
        part.replace_header("Content-Type", f'{content_type}; charset="us-ascii"')
        message.attach(part)
    return message.as_string()


# --- Bottlerocket -------------------------------------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def _toml_key(key: str) -> str:
    return key if key.replace("-", "").replace("_", "").isalnum() else _toml_value(key)


def dump_toml(data: dict[str, Any], prefix: str = "") -> str:
    """Enough TOML for Bottlerocket settings: scalars, arrays and nested tables."""
    lines = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    out = ""
    if prefix and lines:
        out += f"[{prefix}]\n"
    out += "".join(line + "\n" for line in lines)
    for k, v in data.items():
        if isinstance(v, dict):
            out += "\n" + dump_toml(v, f"{prefix}.{_toml_key(k)}" if prefix else _toml_key(k))
    return out


def bottlerocket(cluster: ClusterInfo, node: NodeBootstrap, user_data: str | None) -> str:
    settings = tomllib.loads(user_data) if user_data and user_data.strip() else {}
    kube = settings.setdefault("settings", {}).setdefault("kubernetes", {})
    kube.update(
        {
            "cluster-name": cluster.name,
            "api-server": cluster.endpoint,
            "cluster-certificate": cluster.ca_bundle,
        }
    )
    if "maxPods" in node.kubelet:
        kube["max-pods"] = int(node.kubelet["maxPods"])
    # Karpenter's labels and taints replace the user's: they are what the NodePool promises.
    kube["node-labels"] = dict(sorted(node.all_labels().items()))
    taints: dict[str, list[str]] = {}
    for taint in node.all_taints():
        key_value, effect = taint.rsplit(":", 1)
        key, _, value = key_value.partition("=")
        taints.setdefault(key, []).append(f"{value}:{effect}")
    kube["node-taints"] = taints
    return dump_toml(settings)


# --- AL2 ----------------------------------------------------------------------------------------


def al2(cluster: ClusterInfo, node: NodeBootstrap, user_data: str | None) -> str:
    extra = (
        f"--node-labels={_labels_flag(node.all_labels())} "
        f"--register-with-taints={','.join(node.all_taints())}"
    )
    if "maxPods" in node.kubelet:
        extra += f" --max-pods={int(node.kubelet['maxPods'])}"
    script = (
        "#!/bin/bash -xe\n"
        "exec > >(tee /var/log/user-data.log|logger -t user-data -s 2>/dev/console) 2>&1\n"
        f"/etc/eks/bootstrap.sh '{cluster.name}' --apiserver-endpoint '{cluster.endpoint}' "
        f"--b64-cluster-ca '{cluster.ca_bundle}' --dns-cluster-ip '{_dns_ip(cluster.service_cidr)}' "
        f"--use-max-pods false --kubelet-extra-args '{extra}'\n"
    )
    message = MIMEMultipart(boundary=BOUNDARY)
    for content_type, payload in [*_user_parts(user_data), ("text/x-shellscript", script)]:
        part = MIMEText(payload, _subtype=content_type.split("/", 1)[1])
        part.replace_header("Content-Type", f'{content_type}; charset="us-ascii"')
        message.attach(part)
    return message.as_string()


def _dns_ip(cidr: str) -> str:
    """kube-dns takes the tenth address of the service CIDR on EKS."""
    return str(ipaddress.ip_network(cidr, strict=False).network_address + 10)
