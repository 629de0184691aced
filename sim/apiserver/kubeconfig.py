"""Write a kubeconfig that points kubectl and the official client at an emulator URL."""

from __future__ import annotations

from pathlib import Path

import yaml


def kubeconfig(
    url: str, *, name: str = "karpflow-emulator", namespace: str = "default", token: str = "emulator"
) -> dict:
    """A kubeconfig document: plain HTTP, any bearer token (the emulator does no authentication)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": url}}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}],
        "current-context": name,
        "preferences": {},
    }


def write_kubeconfig(
    path: str | Path, url: str, *, name: str = "karpflow-emulator", namespace: str = "default"
) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(kubeconfig(url, name=name, namespace=namespace), sort_keys=False))
    path.chmod(0o600)
    return path
