"""The dev worker's identity on a secure stack (`karpflow dev up --secure`): it runs as it would in
a cluster, as the `karpflow-worker` ServiceAccount with only the rendered ClusterRole's rights.

`install` applies deploy/overlays/local with the real kubectl (as the admin of the kubeconfig),
asks the TokenRequest API for the ServiceAccount's token (`kubectl create token`) and lays out
what a pod would have mounted: `<state>/serviceaccount/token` and `ca.crt`. The worker then gets
KUBERNETES_SERVICE_HOST/PORT and those two files, and no kubeconfig.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

PROJECT_ROOT = Path(__file__).resolve().parents[1]
LOCAL_OVERLAY = PROJECT_ROOT / "deploy" / "overlays" / "local"
NAMESPACE, ACCOUNT = "karpflow", "karpflow-worker"
# The dev stack lives for days; the kubernetes client re-reads the file, not the API, so a token
# longer than a work week saves a restart.
TOKEN_DURATION = "168h"


class IdentityError(RuntimeError):
    pass


def _kubectl(kubeconfig: Path, *args: str) -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise IdentityError("kubectl is not on PATH: --secure applies deploy/overlays/local with it")
    result = subprocess.run(
        [kubectl, "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        raise IdentityError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def install(kubeconfig: Path, ca_file: Path, mounts: Path) -> Path:
    """Apply the local overlay, then write the ServiceAccount's token and the CA under `mounts`."""
    _kubectl(kubeconfig, "apply", "-k", str(LOCAL_OVERLAY))
    token = _kubectl(kubeconfig, "create", "token", ACCOUNT, "-n", NAMESPACE, "--duration", TOKEN_DURATION)
    mounts.mkdir(parents=True, exist_ok=True)
    (mounts / "token").write_text(token.strip())
    (mounts / "token").chmod(0o600)
    shutil.copyfile(ca_file, mounts / "ca.crt")
    return mounts


def pod_env(kube_url: str, mounts: Path) -> dict[str, str]:
    """What the kubelet gives a pod, pointed at the emulator (the worker's in-cluster loader)."""
    url = urlsplit(kube_url)
    return {
        "KUBERNETES_SERVICE_HOST": url.hostname or "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(url.port or 443),
        "KARPFLOW_KUBE_TOKEN_FILE": str(mounts / "token"),
        "KARPFLOW_KUBE_CA_FILE": str(mounts / "ca.crt"),
    }
