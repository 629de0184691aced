"""The controller respects MaintenanceWindows end to end: the real worker plans on its informer cache,
which reads the windows applied with kubectl, and the invariant checker judges every start."""

from __future__ import annotations

import pytest

from sim.testing import assert_no_violations, kubectl
from tests.integration.controller.test_controller import FAST, TWENTY_PODS, A, B, scenario, until_quiet

pytestmark = pytest.mark.integration

PAUSE_A = f"""
apiVersion: karpflow.dev/v1alpha1
kind: MaintenanceWindow
metadata:
  name: keep-a
spec:
  actions: [Consolidation, Emptiness]
  selector:
    - key: kubernetes.io/hostname
      operator: In
      values: [{A.name}]
"""


@pytest.mark.sim_stack(scenario=scenario([A, B], TWENTY_PODS))
async def test_a_window_blocks_consolidation_of_the_nodes_it_matches_and_not_of_others(karpflow, tmp_path):
    path = tmp_path / "window.yaml"
    path.write_text(PAUSE_A)
    kubectl(karpflow.stack, "apply", "-f", str(path))
    async with karpflow.worker(**FAST):
        final = await until_quiet(karpflow, after_passes=3)
        nodes = await karpflow.nodes()
        # B's pods fit on A: B goes, A stays; without the window both are replaced by one new node
        assert set(nodes) == {A.name}, nodes
        assert final.blocked[A.name].startswith("MaintenanceWindow keep-a blocks Consolidation"), (
            final.blocked
        )
        kubectl(karpflow.stack, "delete", "maintenancewindow", "keep-a")
        await until_quiet(karpflow, after_passes=final.passes + 3)
        after = await karpflow.nodes()
    assert A.name not in after and len(after) == 1, after  # the window closed: A is consolidated too
    assert_no_violations(karpflow.stack)
