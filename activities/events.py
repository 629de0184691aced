"""`record_event`: a Kubernetes Event from workflow code, for what only the workflow knows (a rollback,
an approval awaited). Events that an activity can record at the moment it acts are recorded there,
which costs no history; this activity is for the rest (kube/events.py does the writing).

Best effort like every Event: it never fails, so it needs no retries and never holds up a workflow.
"""

from __future__ import annotations

from temporalio import activity

from api.constants import KARPENTER_GROUP, KARPENTER_VERSION
from api.event_reasons import RecordEventRequest
from kube import events
from kube.client import Json, KubeApi


class EventActivities:
    def __init__(self, kube: KubeApi) -> None:
        self.kube = kube

    async def _object(self, request: RecordEventRequest) -> Json:
        """The object as stored, for its UID (what `kubectl describe` matches); its name alone when
        it is gone (an Event on a deleted node is still worth listing)."""
        try:
            if request.kind == "Node":
                return await self.kube.get_node(request.name)
            if request.kind == "NodePool":
                return await self.kube.get_cluster_custom(
                    KARPENTER_GROUP, KARPENTER_VERSION, "nodepools", request.name
                )
            return await self.kube.request(
                "GET", f"/api/v1/namespaces/{request.namespace}/pods/{request.name}"
            )
        except Exception:  # unreadable or gone: the Event still names it
            return {"metadata": {"name": request.name, "namespace": request.namespace}}

    @activity.defn(name="record_event")
    async def record_event(self, request: RecordEventRequest) -> str:
        """Record the Event; returns the outcome (created, aggregated, deduplicated, rate_limited, failed).
        With a UID (a workflow's pinned node) the object is not read: a node that reuses the name is
        another node, and must not get this node's Event."""
        api_version = f"{KARPENTER_GROUP}/{KARPENTER_VERSION}" if request.kind == "NodePool" else "v1"
        if request.uid:
            ref = events.ObjectRef(request.kind, request.name, request.namespace, request.uid, api_version)
        else:
            ref = events.ObjectRef.of(await self._object(request), request.kind, api_version)
        return await events.recorder_for(self.kube).record(events.Event(ref, request.reason, request.message))
