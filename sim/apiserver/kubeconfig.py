"""Write a kubeconfig that points kubectl and the official client at an emulator URL."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml


def kubeconfig(
    url: str,
    *,
    name: str = "karpflow-emulator",
    namespace: str = "default",
    token: str = "emulator",
    ca_pem: bytes | None = None,
) -> dict:
    """A kubeconfig document: the URL, a bearer token (any string unless the emulator is secure),
    and in secure mode the CA that signed the emulator's certificate."""
    cluster: dict = {"server": url}
    if ca_pem is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}],
        "current-context": name,
        "preferences": {},
    }


def write_kubeconfig(
    path: str | Path,
    url: str,
    *,
    name: str = "karpflow-emulator",
    namespace: str = "default",
    token: str = "emulator",
    ca_pem: bytes | None = None,
) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    document = kubeconfig(url, name=name, namespace=namespace, token=token, ca_pem=ca_pem)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    path.chmod(0o600)
    return path
