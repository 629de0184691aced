"""What a booting instance's kubelet is told, read from its user data the way the AMI reads it.

The simulator's own reader, written apart from karpflow's writer (launch/userdata.py) on purpose: it
is the referee, so a launch whose bootstrap a real AMI would not understand gives a node that never
registers here too. Formats, by what the AMI runs:

- AL2023 (nodeadm): a MIME multi-part document whose `application/node.eks.aws` parts are NodeConfig
  YAML, or one bare NodeConfig. Parts are merged in order: later scalars win, kubelet flags add up
  (and so do the taints of the kubelet configuration's `registerWithTaints`).
- AL2: a shell script (alone or a MIME part) calling `/etc/eks/bootstrap.sh <cluster>` with
  `--apiserver-endpoint`, `--b64-cluster-ca` and `--kubelet-extra-args '<flags>'`.
- Bottlerocket: TOML `settings.kubernetes` (cluster-name, api-server, cluster-certificate,
  node-labels, node-taints as `key = ["value:Effect"]`).

Read too, as the kubelet would be configured: max pods (with AL2's `--use-max-pods false`, which
leaves the kubelet at its default of 110 unless `--max-pods` says otherwise), systemReserved,
kubeReserved, evictionHard and the cluster DNS address (explicit, else the tenth address of the
NodeConfig's service CIDR); sim/controllers/kubelet_config.py turns them into the Node's capacity.

The kubelet flags for labels and taints are `--node-labels` and `--register-with-taints`
(sim/controllers/kubelet_flags.py). A node joins only the cluster it names, at the API endpoint the
simulator serves, with a certificate authority, and only if the kubelet accepts its labels (one
under kubernetes.io or k8s.io outside the kubelet's own set and it never starts); anything else is
a `BootError` and no node.
"""

from __future__ import annotations

import base64
import email
import ipaddress
import shlex
import tomllib
from dataclasses import dataclass, field
from typing import Any

import yaml

from sim.controllers.kubelet_flags import (
    FlagSyntaxError,
    format_node_labels,
    format_taints,
    parse_node_labels,
    parse_taints,
    refused_node_labels,
)

NODECONFIG_TYPE = "application/node.eks.aws"
SIM_CA_BUNDLE = "c2ltdWxhdGVkLWNsdXN0ZXItY2E="  # base64 of "simulated-cluster-ca": any non-empty CA joins
# The simulated cluster's service CIDR: what EKS picks for a VPC in 172.31.0.0/16 (the scenario's).
SIM_SERVICE_CIDR = "10.100.0.0/16"
BOOTSTRAP_SH = "/etc/eks/bootstrap.sh"


class BootError(ValueError):
    """User data a real AMI could not join the cluster with."""


@dataclass
class KubeletBoot:
    cluster: str = ""
    endpoint: str = ""
    ca: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)
    max_pods: int | None = None
    use_max_pods: bool = True  # False: bootstrap.sh leaves max pods to the kubelet (110)
    system_reserved: dict[str, str] = field(default_factory=dict)
    kube_reserved: dict[str, str] = field(default_factory=dict)
    eviction_hard: dict[str, str] = field(default_factory=dict)
    cluster_dns: list[str] = field(default_factory=list)
    service_cidr: str = ""

    @property
    def dns(self) -> str | None:
        """The DNS server pods are told: explicit, else the tenth address of the service CIDR."""
        if self.cluster_dns:
            return self.cluster_dns[0]
        if self.service_cidr:
            return str(ipaddress.ip_network(self.service_cidr, strict=False).network_address + 10)
        return None


def read(
    user_data: str | None, *, cluster: str, endpoint: str | None = None, ca_pem: bytes | None = None
) -> KubeletBoot:
    """The kubelet's registration settings, or BootError saying why the node would never join.
    `ca_pem`: the CA that signed the API server's certificate (a secure stack); a kubelet given
    another one fails its TLS handshake and never registers."""
    text = (user_data or "").strip()
    if not text:
        raise BootError("no user data: nothing bootstraps the kubelet")
    if text.startswith(("MIME-Version", "Content-Type")):
        boot = _mime(text)
    elif text.startswith("#!"):
        boot = _script(text)
    elif "[settings" in text:
        boot = _bottlerocket(text)
    else:
        boot = KubeletBoot()
        _nodeconfig(text, boot)
    if not boot.cluster:
        raise BootError(
            "the user data names no cluster (no NodeConfig, bootstrap.sh or Bottlerocket settings)"
        )
    if boot.cluster != cluster:
        raise BootError(f"the user data joins cluster {boot.cluster!r}, not {cluster!r}")
    if not boot.endpoint:
        raise BootError("the user data gives no API server endpoint")
    if endpoint and boot.endpoint.rstrip("/") != endpoint.rstrip("/"):
        raise BootError(f"the user data's API server {boot.endpoint} is not this cluster's ({endpoint})")
    if not boot.ca:
        raise BootError("the user data gives no cluster certificate authority")
    if ca_pem is not None and _pem(boot.ca) != ca_pem.strip():
        raise BootError("the user data's certificate authority did not sign the API server's certificate")
    refused = refused_node_labels(boot.labels)
    if refused:
        # kubernetes/kubernetes cmd/kubelet/app/options/options.go ValidateKubeletFlags: the kubelet
        # exits before it ever talks to the API server.
        raise BootError(
            f"the kubelet refuses to start: unknown 'kubernetes.io' or 'k8s.io' labels in --node-labels: "
            f"{', '.join(refused)} (only kubelet.kubernetes.io/*, node.kubernetes.io/* and the "
            "kubelet's own well-known labels are allowed there)"
        )
    return boot


def _pem(ca: str) -> bytes:
    """The base64 CA bundle of user data as PEM bytes (empty when it is not base64)."""
    try:
        return base64.b64decode(ca, validate=True).strip()
    except ValueError:
        return b""


def _mime(text: str) -> KubeletBoot:
    message = email.message_from_string(text)
    boot = KubeletBoot()
    parts = [p for p in message.walk() if not p.is_multipart()]
    if not parts:
        raise BootError("the MIME user data has no parts")
    for part in parts:
        payload = part.get_payload(decode=True)
        body = payload.decode() if isinstance(payload, bytes) else str(part.get_payload())
        if part.get_content_type() == NODECONFIG_TYPE:
            _nodeconfig(body, boot)
        elif part.get_content_type() == "text/x-shellscript" and BOOTSTRAP_SH in body:
            _merge(boot, _script(body))
    return boot


def _nodeconfig(body: str, boot: KubeletBoot) -> None:
    try:
        documents = [d for d in yaml.safe_load_all(body) if d]
    except yaml.YAMLError as err:
        raise BootError(f"nodeadm cannot read a NodeConfig: {err}") from None
    for doc in documents:
        if not isinstance(doc, dict) or doc.get("kind") != "NodeConfig":
            raise BootError(
                f"nodeadm expects kind NodeConfig, got {doc.get('kind') if isinstance(doc, dict) else doc!r}"
            )
        spec = doc.get("spec") or {}
        cluster = spec.get("cluster") or {}
        boot.cluster = cluster.get("name") or boot.cluster
        boot.endpoint = cluster.get("apiServerEndpoint") or boot.endpoint
        boot.ca = cluster.get("certificateAuthority") or boot.ca
        boot.service_cidr = cluster.get("cidr") or boot.service_cidr
        kubelet = spec.get("kubelet") or {}
        _kubelet_config(kubelet.get("config") or {}, boot)
        for flag in kubelet.get("flags") or ():
            _flag(str(flag), boot)


def _kubelet_config(config: dict[str, Any], boot: KubeletBoot) -> None:
    """A KubeletConfiguration document (nodeadm's `kubelet.config`): later documents win per key."""
    if config.get("maxPods") is not None:
        boot.max_pods = _int(config["maxPods"], "maxPods")
    for key, attr in (
        ("systemReserved", "system_reserved"),
        ("kubeReserved", "kube_reserved"),
        ("evictionHard", "eviction_hard"),
    ):
        if config.get(key):
            setattr(boot, attr, {str(k): str(v) for k, v in dict(config[key]).items()})
    if config.get("clusterDNS"):
        boot.cluster_dns = [str(ip) for ip in config["clusterDNS"]]
    for taint in config.get("registerWithTaints") or ():  # the kubelet's config form of the flag
        if not isinstance(taint, dict) or not taint.get("key") or not taint.get("effect"):
            raise BootError(f"the kubelet refuses registerWithTaints entry {taint!r}")
        try:
            boot.taints.extend(parse_taints(format_taints([taint]), "registerWithTaints"))
        except FlagSyntaxError as err:
            raise BootError(f"the kubelet refuses registerWithTaints: {err}") from None


def _int(value: Any, what: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise BootError(f"the kubelet refuses {what}={value!r}: not an integer") from None


def _pairs(value: str, separator: str, flag: str) -> dict[str, str]:
    """`a=1,b=2` (or `memory.available<100Mi,...` for eviction flags) as a map."""
    out = {}
    for item in value.split(","):
        key, sep, amount = item.partition(separator)
        if not sep or not key or not amount:
            raise BootError(f"the kubelet refuses {flag}={value}: {item!r} is not key{separator}value")
        out[key] = amount
    return out


def _flag(flag: str, boot: KubeletBoot) -> None:
    name, _, value = flag.partition("=")
    try:
        if name == "--node-labels":
            boot.labels.update(parse_node_labels(value))
        elif name == "--register-with-taints":
            boot.taints.extend(parse_taints(value))
        elif name == "--max-pods":
            boot.max_pods = _int(value, name)
        elif name == "--system-reserved":
            boot.system_reserved = _pairs(value, "=", name)
        elif name == "--kube-reserved":
            boot.kube_reserved = _pairs(value, "=", name)
        elif name == "--eviction-hard":
            boot.eviction_hard = _pairs(value, "<", name)
    except FlagSyntaxError as err:
        raise BootError(f"the kubelet refuses {name}: {err}") from None


def _script(body: str) -> KubeletBoot:
    boot = KubeletBoot()
    for line in body.splitlines():
        if BOOTSTRAP_SH not in line:
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError as err:
            raise BootError(f"the shell cannot parse the bootstrap.sh line: {err}") from None
        args = words[words.index(BOOTSTRAP_SH) + 1 :] if BOOTSTRAP_SH in words else []
        options: dict[str, str] = {}
        positional = []
        i = 0
        while i < len(args):
            if args[i].startswith("--") and i + 1 < len(args):
                options[args[i]] = args[i + 1]
                i += 2
            else:
                positional.append(args[i])
                i += 1
        boot.cluster = positional[0] if positional else ""
        boot.endpoint = options.get("--apiserver-endpoint", "")
        boot.ca = options.get("--b64-cluster-ca", "")
        boot.use_max_pods = options.get("--use-max-pods", "true").lower() != "false"
        if options.get("--dns-cluster-ip"):
            boot.cluster_dns = [options["--dns-cluster-ip"]]
        for flag in (options.get("--kubelet-extra-args") or "").split():
            _flag(flag, boot)
    return boot


def _bottlerocket(text: str) -> KubeletBoot:
    try:
        kube = tomllib.loads(text).get("settings", {}).get("kubernetes", {})
    except tomllib.TOMLDecodeError as err:
        raise BootError(f"Bottlerocket cannot read its settings: {err}") from None
    boot = KubeletBoot(
        cluster=kube.get("cluster-name", ""),
        endpoint=kube.get("api-server", ""),
        ca=kube.get("cluster-certificate", ""),
        cluster_dns=[kube["cluster-dns-ip"]] if kube.get("cluster-dns-ip") else [],
    )
    if kube.get("max-pods") is not None:
        boot.max_pods = _int(kube["max-pods"], "max-pods")
    for key, attr in (
        ("system-reserved", "system_reserved"),
        ("kube-reserved", "kube_reserved"),
        ("eviction-hard", "eviction_hard"),
    ):
        if isinstance(kube.get(key), dict):
            setattr(boot, attr, {str(k): str(v) for k, v in kube[key].items()})
    labels = kube.get("node-labels") or {}
    taints: dict[str, Any] = kube.get("node-taints") or {}
    try:
        boot.labels = parse_node_labels(format_node_labels({str(k): str(v) for k, v in labels.items()}))
        for key, values in taints.items():
            for entry in values if isinstance(values, list) else [values]:
                value, _, effect = str(entry).rpartition(":")
                boot.taints.extend(parse_taints(f"{key}={value}:{effect}" if value else f"{key}:{effect}"))
    except FlagSyntaxError as err:
        raise BootError(f"Bottlerocket refuses its node settings: {err}") from None
    return boot


def _merge(into: KubeletBoot, other: KubeletBoot) -> None:
    into.cluster = other.cluster or into.cluster
    into.endpoint = other.endpoint or into.endpoint
    into.ca = other.ca or into.ca
    into.labels.update(other.labels)
    into.taints.extend(other.taints)
    into.max_pods = other.max_pods if other.max_pods is not None else into.max_pods
    into.use_max_pods = other.use_max_pods and into.use_max_pods
    into.system_reserved = other.system_reserved or into.system_reserved
    into.kube_reserved = other.kube_reserved or into.kube_reserved
    into.eviction_hard = other.eviction_hard or into.eviction_hard
    into.cluster_dns = other.cluster_dns or into.cluster_dns


def nodeconfig(
    cluster: str,
    endpoint: str,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, Any]] | None = None,
    max_pods: int | None = None,
) -> str:
    """A bare AL2023 NodeConfig, for instances the simulator's own tests and scenarios launch."""
    config = {"maxPods": max_pods} if max_pods is not None else {}
    flags = []
    if labels:
        flags.append(f"--node-labels={format_node_labels(labels)}")
    if taints:
        flags.append(f"--register-with-taints={format_taints(taints)}")
    return yaml.safe_dump(
        {
            "apiVersion": "node.eks.aws/v1alpha1",
            "kind": "NodeConfig",
            "spec": {
                "cluster": {
                    "name": cluster,
                    "apiServerEndpoint": endpoint,
                    "certificateAuthority": SIM_CA_BUNDLE,
                },
                "kubelet": {"config": config, "flags": flags},
            },
        }
    )
