"""Events written by kube/events.py read back by the real kubectl from the emulator, as an operator
reads them: `kubectl get events -A` lists them, `kubectl describe node` shows a node's own (matched
by name, kind and UID), a repeat shows as a count on one line."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from kube import events
from kube.client import KubeApi
from kube.events import EventRecorder
from sim.testing import kubectl

pytestmark = pytest.mark.integration


async def test_kubectl_lists_and_describes_the_recorded_events(sim_stack):
    kube = KubeApi.for_host(sim_stack.kube_url)
    try:
        nodes = (await kube.list_nodes())["items"]
        node, other = nodes[0], nodes[1]
        pods = [p for p in (await kube.request("GET", "/api/v1/pods"))["items"] if p["spec"].get("nodeName")]
        pod = pods[0]
        recorder = EventRecorder(kube, dedupe_override=timedelta(0))
        assert (
            await recorder.record(events.disruption_blocked(node, "a pod with do-not-disrupt")) == "created"
        )
        assert (
            await recorder.record(events.disruption_blocked(node, "a pod with do-not-disrupt"))
            == "aggregated"
        )
        assert await recorder.record(events.disruption_terminating(other, "Underutilized")) == "created"
        assert await recorder.record(events.evicted(pod, "Underutilized")) == "created"
    finally:
        await kube.close()

    listed = json.loads(kubectl(sim_stack, "get", "events", "-A", "-o", "json"))["items"]
    mine = {
        (e["involvedObject"]["name"], e["reason"]): e
        for e in listed
        if e["source"]["component"] == "karpflow"
    }
    assert mine[(node["metadata"]["name"], "DisruptionBlocked")]["count"] == 2
    assert (other["metadata"]["name"], "DisruptionTerminating") in mine
    assert mine[(pod["metadata"]["name"], "Evicted")]["metadata"]["namespace"] == pod["metadata"]["namespace"]

    table = kubectl(sim_stack, "get", "events", "-A")
    assert "DisruptionBlocked" in table and "Evicted" in table

    described = kubectl(sim_stack, "describe", "node", node["metadata"]["name"])
    events_section = described.split("Events:", 1)[1]
    assert "DisruptionBlocked" in events_section, described
    assert "Cannot disrupt Node: a pod with do-not-disrupt" in events_section
    assert "karpflow" in events_section
    assert "DisruptionTerminating" not in events_section  # the other node's

    described_pod = kubectl(
        sim_stack, "describe", "pod", "-n", pod["metadata"]["namespace"], pod["metadata"]["name"]
    )
    assert "Evicted pod: Underutilized" in described_pod.split("Events:", 1)[1]
