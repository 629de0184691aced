"""How the demo shows a replacement: one progress line per state (offering, instance, node as each
becomes known) and the end-of-demo line for a node that joined. No servers."""

from __future__ import annotations

from api.workflow_io import Offering, ReplacementStatus
from sim.demo import new_node_line
from sim.disruption_rows import DisruptionProgress, progress_line, replacement_text

NODE = "ip-172-31-16-4.us-west-2.compute.internal"
OFFERING = Offering(instance_type="r5.large", zone="us-west-2b", capacity_type="spot")


def test_a_replacement_shows_what_is_known_at_each_state():
    pending = ReplacementStatus(index=0, nodepool="default")
    launched = pending.model_copy(update={"state": "Launched", "offering": OFFERING, "instance_id": "i-0abc"})
    registered = launched.model_copy(update={"state": "Registered", "node": NODE})
    assert replacement_text(pending) == "default: Pending"
    assert replacement_text(launched) == "default: Launched r5.large/us-west-2b/spot i-0abc"
    assert (
        replacement_text(registered) == "default: Registered r5.large/us-west-2b/spot i-0abc → ip-172-31-16-4"
    )


def test_a_failed_replacement_says_why():
    failed = ReplacementStatus(
        index=0, nodepool="default", state="Failed", message="no offering had capacity"
    )
    assert replacement_text(failed) == "default: Failed (no offering had capacity)"
    # The message of a replacement still on its way is not a failure: it is left out.
    launching = failed.model_copy(update={"state": "Launching", "offering": OFFERING})
    assert replacement_text(launching) == "default: Launching r5.large/us-west-2b/spot"


def test_the_progress_line_lists_the_replacements():
    row = DisruptionProgress(
        workflow_id="disruption/default/Drifted/x",
        reason="Drifted",
        nodes=["ip-172-31-20-80.us-west-2.compute.internal"],
        phase="WaitingForReplacements",
        replacements=["default: Registered r5.large/us-west-2b/spot i-0abc → ip-172-31-16-4"],
        terminations={"ip-172-31-20-80.us-west-2.compute.internal": "NotStarted"},
    )
    assert progress_line(row) == (
        "disruption/default/Drifted/x: Running/WaitingForReplacements  "
        "replacements default: Registered r5.large/us-west-2b/spot i-0abc → ip-172-31-16-4  "
        "terminations ip-172-31-20-80 NotStarted"
    )


def node(name: str) -> dict[str, object]:
    labels = {
        "node.kubernetes.io/instance-type": "r5.large",
        "karpenter.sh/capacity-type": "spot",
        "topology.kubernetes.io/zone": "us-west-2b",
    }
    return {"metadata": {"name": name, "labels": labels}}


def test_a_new_node_names_the_disruption_that_launched_it():
    row = DisruptionProgress(
        workflow_id="disruption/default/Drifted/x",
        reason="Drifted",
        nodes=["ip-172-31-20-80.us-west-2.compute.internal"],
        execution="Completed",
        replaced_by=[NODE],
    )
    assert new_node_line(node(NODE), [row]) == (
        f"{NODE}: r5.large spot in us-west-2b, launched by disruption/default/Drifted/x "
        "to replace ip-172-31-20-80 (Drifted)"
    )
    other = "ip-172-31-16-9.us-west-2.compute.internal"
    assert new_node_line(node(other), [row]) == (
        f"{other}: r5.large spot in us-west-2b, not launched by a disruption of this demo"
    )
