"""`karpflow demo` end to end (what `make demo` runs), on free ports and a temporary state dir."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from sim.devstack import DevStack
from sim.scenario import load_scenario
from sim.testing import DEMO

from .test_devstack import free_ports

pytestmark = pytest.mark.integration


def test_the_demo_shows_the_cluster_and_cleans_up(tmp_path):
    temporal, ui, kube, moto = free_ports(4)
    state = tmp_path / "state"
    started = time.monotonic()
    ports = [
        "--temporal-port",
        str(temporal),
        "--ui-port",
        str(ui),
        "--kube-port",
        str(kube),
        "--moto-port",
        str(moto),
    ]
    result = subprocess.run(
        [sys.executable, "-m", "cli", "demo", "--state-dir", str(state), *ports],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    )
    elapsed = time.monotonic() - started
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    # Every scenario node, through the real kubectl, and its instance in moto.
    for node in load_scenario(DEMO).of_kind("Node"):
        assert out.count(node["metadata"]["name"]) >= 2, node["metadata"]["name"]
    for section in (
        "$ kubectl get nodes -o wide",
        "$ kubectl get pdb -A",
        "$ kubectl get nodepools",
        "EC2 instances",
    ):
        assert section in out
    assert out.count(" running ") >= 13 or out.count("│ running") >= 13
    assert "No invariant violations" in out
    assert f"http://127.0.0.1:{ui}" in out
    assert "Stopped" in out and "Demo finished" in out
    assert not DevStack.from_state_dir(state).running()
    print(f"demo took {elapsed:.1f}s")
