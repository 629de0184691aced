"""Who holds a node (activities/guards.py `other_holder`): one command at a time, and beside Karpenter
a `karpenter.sh/disrupted` taint is Karpenter's whatever annotation the node carries."""

from __future__ import annotations

from typing import Any

import pytest

from activities.guards import OWNER_ANNOTATION, other_holder
from api.constants import DISRUPTED_TAINT_KEY, KARPFLOW_DISRUPTED_TAINT_KEY


def node(*keys: str, owner: str | None = None) -> dict[str, Any]:
    annotations = {OWNER_ANNOTATION: owner} if owner else {}
    taints = [{"key": key, "effect": "NoSchedule"} for key in keys]
    return {"metadata": {"name": "n1", "annotations": annotations}, "spec": {"taints": taints}}


@pytest.mark.parametrize(
    ("keys", "owner", "mode_key", "holder"),
    [
        ((), None, DISRUPTED_TAINT_KEY, None),
        ((DISRUPTED_TAINT_KEY,), "me", DISRUPTED_TAINT_KEY, None),
        ((DISRUPTED_TAINT_KEY,), "other", DISRUPTED_TAINT_KEY, "command other"),
        ((DISRUPTED_TAINT_KEY,), None, DISRUPTED_TAINT_KEY, "another controller"),
        # beside Karpenter: karpflow's own key, held by this command or another
        ((KARPFLOW_DISRUPTED_TAINT_KEY,), "me", KARPFLOW_DISRUPTED_TAINT_KEY, None),
        ((KARPFLOW_DISRUPTED_TAINT_KEY,), "other", KARPFLOW_DISRUPTED_TAINT_KEY, "command other"),
        # Karpenter's taint is Karpenter's, even on a node this command annotated
        ((DISRUPTED_TAINT_KEY,), "me", KARPFLOW_DISRUPTED_TAINT_KEY, "Karpenter"),
        (
            (DISRUPTED_TAINT_KEY, KARPFLOW_DISRUPTED_TAINT_KEY),
            "me",
            KARPFLOW_DISRUPTED_TAINT_KEY,
            "Karpenter",
        ),
    ],
)
def test_who_else_holds_the_node(keys, owner, mode_key, holder):
    found = other_holder(node(*keys, owner=owner), "me", mode_key)
    if holder is None:
        assert found is None
    else:
        assert found is not None and found.startswith(holder), found
