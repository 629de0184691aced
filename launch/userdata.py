"""Bootstrap user data per AMI family, merged with the EC2NodeClass's own user data.

Follows Karpenter's AWS provider (pkg/providers/amifamily/bootstrap): AL2023 gets a MIME multi-part
document whose last part is a nodeadm NodeConfig (the user's parts come first, so ours wins where
both set a value); Bottlerocket gets TOML where karpflow's `settings.kubernetes` keys override the
user's and the NodePool's labels are merged into the user's; AL2 gets /etc/eks/bootstrap.sh; Custom
is left exactly as the user wrote it.

The NodePool's labels go to the kubelet only where it accepts them (launch/kubelet_labels.py): one
under `kubernetes.io`/`k8s.io` outside the kubelet's own set would stop it from starting, so those
wait for registration (activities/node_registration.py), which writes every NodePool label on the Node.

Every family is told the same kubelet settings, as Karpenter tells them: the EC2NodeClass `kubelet`
(maxPods, podsPerCore, systemReserved, kubeReserved, evictionHard/Soft/SoftGracePeriod/
MaxPodGracePeriod, imageGC thresholds, cpuCFSQuota, clusterDNS), with maxPods defaulting to the
instance type's ENI-limited pod count (what the planner packs against) and clusterDNS to the tenth
address of the service CIDR (kube-dns on EKS).
"""

from __future__ import annotations

import email
import ipaddress
import re
import tomllib
from dataclasses import dataclass, field
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from typing import Any, cast

import yaml

from launch.kubelet_labels import for_kubelet

UNREGISTERED_TAINT = "karpenter.sh/unregistered:NoExecute"
NODEPOOL_LABEL = "karpenter.sh/nodepool"
BOUNDARY = "//"
RAID0 = "RAID0"


@dataclass(frozen=True)
class ClusterInfo:
    name: str
    endpoint: str
    ca_bundle: str  # base64 PEM, as DescribeCluster returns it
    service_cidr: str


@dataclass(frozen=True)
class NodeBootstrap:
    nodepool: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[str] = field(default_factory=list)  # kubelet syntax key=value:Effect
    startup_taints: list[str] = field(default_factory=list)
    kubelet: dict[str, Any] = field(default_factory=dict)  # EC2NodeClass spec.kubelet
    max_pods: int | None = None  # the instance type's, used when the class sets no maxPods
    instance_store_policy: str | None = None  # EC2NodeClass spec.instanceStorePolicy

    def all_labels(self) -> dict[str, str]:
        return {**self.labels, NODEPOOL_LABEL: self.nodepool}

    def kubelet_labels(self) -> dict[str, str]:
        """The labels the kubelet is told: those it accepts (launch/kubelet_labels.py); registration
        writes the rest."""
        return for_kubelet(self.all_labels())

    def all_taints(self) -> list[str]:
        return [*self.taints, *self.startup_taints, UNREGISTERED_TAINT]

    def kubelet_config(self, cluster: ClusterInfo) -> dict[str, Any]:
        """The EC2NodeClass kubelet settings with Karpenter's defaults for maxPods and clusterDNS."""
        config = dict(self.kubelet)
        if config.get("maxPods") is None and self.max_pods is not None:
            config["maxPods"] = self.max_pods
        if not config.get("clusterDNS"):
            config["clusterDNS"] = [dns_ip(cluster.service_cidr)]
        return config

    @property
    def raid0(self) -> bool:
        return self.instance_store_policy == RAID0


def dns_ip(cidr: str) -> str:
    """kube-dns takes the tenth address of the service CIDR on EKS."""
    return str(ipaddress.ip_network(cidr, strict=False).network_address + 10)


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
    flags = [
        f"--node-labels={_labels_flag(node.kubelet_labels())}",
        f"--register-with-taints={','.join(node.all_taints())}",
    ]
    spec: dict[str, Any] = {
        "cluster": {
            "name": cluster.name,
            "apiServerEndpoint": cluster.endpoint,
            "certificateAuthority": cluster.ca_bundle,
            "cidr": cluster.service_cidr,
        },
        # nodeadm takes the kubelet's own configuration keys, which are the EC2NodeClass's names.
        "kubelet": {"config": node.kubelet_config(cluster), "flags": flags},
    }
    if node.raid0:
        spec["instance"] = {"localStorage": {"strategy": RAID0}}
    return {"apiVersion": "node.eks.aws/v1alpha1", "kind": "NodeConfig", "spec": spec}


def _user_parts(user_data: str | None) -> list[tuple[str, str]]:
    """(content type, payload) of each part of the user's user data; a plain script is one part."""
    if not user_data or not user_data.strip():
        return []
    if user_data.lstrip().startswith("MIME-Version"):
        message = email.message_from_string(user_data)
        if not message.is_multipart():
            raise ValueError("userData is a MIME document but not multipart")
        return [
            # typeshed's get_payload says Message | bytes; decoded, a part that is not multipart is bytes.
            (part.get_content_type(), cast(bytes, part.get_payload(decode=True)).decode())
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
    return '"' + "".join(_TOML_ESCAPES.get(c) or _control(c) for c in str(value)) + '"'


_TOML_ESCAPES = {"\\": "\\\\", '"': '\\"', "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _control(char: str) -> str:
    # TOML's basic strings may not hold control characters raw: the user's own escapes come back.
    return f"\\u{ord(char):04x}" if ord(char) < 0x20 or ord(char) == 0x7F else char


def _toml_key(key: str) -> str:
    # Only ASCII letters, digits, - and _ may be bare ("é".isalnum() is true, yet not a bare key).
    return key if _BARE_KEY.fullmatch(key) else _toml_value(key)


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


# EC2NodeClass kubelet key -> Bottlerocket settings.kubernetes key (maps and scalars alike).
BOTTLEROCKET_KUBELET = {
    "systemReserved": "system-reserved",
    "kubeReserved": "kube-reserved",
    "evictionHard": "eviction-hard",
    "evictionSoft": "eviction-soft",
    "evictionSoftGracePeriod": "eviction-soft-grace-period",
    "evictionMaxPodGracePeriod": "eviction-max-pod-grace-period",
    "cpuCFSQuota": "cpu-cfs-quota-enforced",
}
# Bottlerocket takes the image GC thresholds as strings.
BOTTLEROCKET_KUBELET_TEXT = {
    "imageGCHighThresholdPercent": "image-gc-high-threshold-percent",
    "imageGCLowThresholdPercent": "image-gc-low-threshold-percent",
}
# Instance store as RAID0 for containerd and the kubelet (Karpenter's bootstrap command).
BOTTLEROCKET_RAID0 = {
    "commands": [
        ["apiclient", "ephemeral-storage", "init"],
        [
            "apiclient",
            "ephemeral-storage",
            "bind",
            "--dirs",
            "/var/lib/containerd",
            "/var/lib/kubelet",
            "/var/log/pods",
        ],
    ],
    "mode": "always",
    "essential": True,
}


def _table(parent: dict[str, Any], key: str, path: str) -> dict[str, Any]:
    """The user's table at `key` (made when absent); a scalar where karpflow merges its settings is
    refused as the ValueError of a bad EC2NodeClass, not an AttributeError deep in the launch."""
    table = parent.setdefault(key, {})
    if not isinstance(table, dict):
        raise ValueError(f"userData: {path} must be a TOML table, got {type(table).__name__}")
    return table


def bottlerocket(cluster: ClusterInfo, node: NodeBootstrap, user_data: str | None) -> str:
    settings = tomllib.loads(user_data) if user_data and user_data.strip() else {}
    root = _table(settings, "settings", "settings")
    kube = _table(root, "kubernetes", "settings.kubernetes")
    _table(kube, "node-labels", "settings.kubernetes.node-labels")
    config = node.kubelet_config(cluster)
    kube.update(
        {
            "cluster-name": cluster.name,
            "api-server": cluster.endpoint,
            "cluster-certificate": cluster.ca_bundle,
            "cluster-dns-ip": config["clusterDNS"][0],
        }
    )
    if config.get("maxPods") is not None:
        kube["max-pods"] = int(config["maxPods"])
    for ours, theirs in BOTTLEROCKET_KUBELET.items():
        if config.get(ours) is not None:
            kube[theirs] = config[ours]
    for ours, theirs in BOTTLEROCKET_KUBELET_TEXT.items():
        if config.get(ours) is not None:
            kube[theirs] = str(config[ours])
    # The NodePool's labels the kubelet accepts join the user's (ours win a clash); its taints
    # replace theirs, as in Karpenter: the node registers with exactly the taints the NodePool promises.
    kube["node-labels"] = dict(sorted({**(kube.get("node-labels") or {}), **node.kubelet_labels()}.items()))
    taints: dict[str, list[str]] = {}
    for taint in node.all_taints():
        key_value, effect = taint.rsplit(":", 1)
        key, _, value = key_value.partition("=")
        taints.setdefault(key, []).append(f"{value}:{effect}")
    kube["node-taints"] = taints
    if isinstance(root.get("autoscaling"), dict) and "should-wait" in root["autoscaling"]:
        root["autoscaling"]["should-wait"] = False  # no Auto Scaling group would ever answer
    if node.raid0:
        root.setdefault("bootstrap-commands", {})["000-mount-instance-storage"] = BOTTLEROCKET_RAID0
    return dump_toml(settings)


# --- AL2 ----------------------------------------------------------------------------------------


def _joined(values: dict[str, Any], separator: str) -> str:
    return ",".join(f"{k}{separator}{v}" for k, v in sorted(values.items()))


def al2_kubelet_args(cluster: ClusterInfo, node: NodeBootstrap) -> list[str]:
    """bootstrap.sh's --kubelet-extra-args: the kubelet's own command-line flags."""
    config = node.kubelet_config(cluster)
    args = [
        f"--node-labels={_labels_flag(node.kubelet_labels())}",
        f"--register-with-taints={','.join(node.all_taints())}",
    ]
    if config.get("maxPods") is not None:
        args.append(f"--max-pods={int(config['maxPods'])}")
    if config.get("podsPerCore") is not None:
        args.append(f"--pods-per-core={int(config['podsPerCore'])}")
    for key, flag, separator in (
        ("systemReserved", "--system-reserved", "="),
        ("kubeReserved", "--kube-reserved", "="),
        ("evictionHard", "--eviction-hard", "<"),
        ("evictionSoft", "--eviction-soft", "<"),
        ("evictionSoftGracePeriod", "--eviction-soft-grace-period", "="),
    ):
        if config.get(key):
            args.append(f"{flag}={_joined(config[key], separator)}")
    for key, flag in (
        ("evictionMaxPodGracePeriod", "--eviction-max-pod-grace-period"),
        ("imageGCHighThresholdPercent", "--image-gc-high-threshold"),
        ("imageGCLowThresholdPercent", "--image-gc-low-threshold"),
    ):
        if config.get(key) is not None:
            args.append(f"{flag}={int(config[key])}")
    if config.get("cpuCFSQuota") is not None:
        args.append(f"--cpu-cfs-quota={'true' if config['cpuCFSQuota'] else 'false'}")
    return args


def al2(cluster: ClusterInfo, node: NodeBootstrap, user_data: str | None) -> str:
    config = node.kubelet_config(cluster)
    line = (
        f"/etc/eks/bootstrap.sh '{cluster.name}' --apiserver-endpoint '{cluster.endpoint}' "
        f"--b64-cluster-ca '{cluster.ca_bundle}' --dns-cluster-ip '{config['clusterDNS'][0]}'"
    )
    if config.get("maxPods") is not None:
        # Without it bootstrap.sh would compute max pods itself; with it and no --max-pods, the
        # kubelet would allow its default 110 while the planner counts the ENI limit.
        line += " --use-max-pods false"
    line += f" --kubelet-extra-args '{' '.join(al2_kubelet_args(cluster, node))}'"
    if node.raid0:
        line += " --local-disks raid0"
    script = (
        "#!/bin/bash -xe\n"
        "exec > >(tee /var/log/user-data.log|logger -t user-data -s 2>/dev/console) 2>&1\n"
        f"{line}\n"
    )
    message = MIMEMultipart(boundary=BOUNDARY)
    for content_type, payload in [*_user_parts(user_data), ("text/x-shellscript", script)]:
        part = MIMEText(payload, _subtype=content_type.split("/", 1)[1])
        part.replace_header("Content-Type", f'{content_type}; charset="us-ascii"')
        message.attach(part)
    return message.as_string()
