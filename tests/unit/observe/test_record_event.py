"""The `record_event` activity: the object's UID looked up so `kubectl describe` matches, and never a
failure for the workflow."""

from __future__ import annotations

from typing import Any

from activities.events import EventActivities
from api.event_reasons import Reason, RecordEventRequest
from kube.client import KubeError
from tests.unit.observe.test_events import FakeEventsApi


class Api(FakeEventsApi):
    def __init__(self, nodes: dict[str, str]) -> None:
        super().__init__()
        self.nodes = nodes

    async def get_node(self, name: str) -> dict[str, Any]:
        if name not in self.nodes:
            raise KubeError(404, "NotFound")
        return {"metadata": {"name": name, "uid": self.nodes[name]}}


async def test_a_rollback_event_names_the_nodes_uid():
    api = Api({"n1": "uid-1"})
    request = RecordEventRequest(
        kind="Node", name="n1", reason=Reason.DISRUPTION_ROLLED_BACK, message="replacement never ready"
    )
    assert await EventActivities(api).record_event(request) == "created"  # type: ignore[arg-type]
    ((_, event),) = api.events.items()
    assert event["involvedObject"]["uid"] == "uid-1" and event["type"] == "Warning"
    assert (event["reason"], event["message"]) == ("DisruptionRolledBack", "replacement never ready")


async def test_a_node_already_gone_still_gets_its_event_and_a_failing_api_is_no_failure():
    api = Api({})
    request = RecordEventRequest(kind="Node", name="gone", reason=Reason.FAILED_TERMINATION, message="x")
    assert await EventActivities(api).record_event(request) == "created"  # type: ignore[arg-type]
    ((_, event),) = api.events.items()
    assert event["involvedObject"]["name"] == "gone" and "uid" not in event["involvedObject"]
    api.fail_with = KubeError(500, "Internal")
    request = RecordEventRequest(kind="Node", name="gone", reason=Reason.FAILED_TERMINATION, message="y")
    assert await EventActivities(api).record_event(request) == "failed"  # type: ignore[arg-type]
