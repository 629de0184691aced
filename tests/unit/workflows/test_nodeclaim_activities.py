"""activities/nodeclaims.py without a cluster: the NodeClaim a replacement asks Karpenter for passes
Karpenter's CRD and says what the planner chose; its status reads back as Karpenter fills it; and a
handed-over node's deadline on its NodeClaim only ever moves earlier."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.testing import ActivityEnvironment

from activities.nodeclaims import (
    REPLACEMENT_FOR_ANNOTATION,
    KarpenterHandover,
    NodeClaimActivities,
    nodeclaim_body,
    nodeclaim_state,
)
from api.activity_io import AmiChoice, HandoverWait, LaunchTemplate, NodeClaimRequest, NodeClaimWait
from api.constants import TERMINATION_TIMESTAMP_ANNOTATION
from api.workflow_io import Offering, ReplacementSpec, TaintSpec
from kube.client import KubeError
from sim.apiserver import crds, resources
from sim.cluster_builder import ClusterBuilder

COMMAND = "disruption/prod/default/Underutilized/abc"


def request() -> tuple[NodeClaimRequest, dict[str, Any]]:
    b = ClusterBuilder()
    b.nodeclass()
    pool = b.nodepool(
        "default",
        termination_grace_period="1h",
        requirements=[
            {
                "key": "node.kubernetes.io/instance-type",
                "operator": "In",
                "values": ["m5.large", "m5.xlarge"],
            },
            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
        ],
    )
    pool["metadata"]["uid"] = "pool-uid"
    spec = ReplacementSpec(
        nodepool="default",
        offerings=[
            Offering(instance_type="m5.large", zone="us-west-2a", capacity_type="spot"),
            Offering(instance_type="m5.large", zone="us-west-2b", capacity_type="on-demand"),
        ],
    )
    template = LaunchTemplate(
        nodepool="default",
        nodeclass="default",
        subnets={"us-west-2a": "subnet-a"},
        security_group_ids=["sg-1"],
        amis=[AmiChoice(id="ami-1")],
        labels={"karpenter.sh/nodepool": "default", "team": "web"},
        annotations={"karpenter.sh/nodepool-hash": "123"},
        taints=[TaintSpec(key="dedicated", value="web", effect="NoSchedule")],
        via_nodeclaim=True,
    )
    return NodeClaimRequest(
        name="default-0a1b2c", command_id=COMMAND, index=0, spec=spec, template=template
    ), pool


def test_the_nodeclaim_is_valid_by_karpenters_crd_and_pins_the_planners_offerings():
    req, pool = request()
    body = nodeclaim_body(req, pool)
    assert crds.schema_errors(resources.resolve("nodeclaims"), body, None) == []
    spec = body["spec"]
    assert spec["nodeClassRef"] == {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}
    requirements = {r["key"]: r["values"] for r in spec["requirements"]}
    assert requirements["node.kubernetes.io/instance-type"] == ["m5.large"]  # narrowed, not the pool's two
    assert requirements["topology.kubernetes.io/zone"] == ["us-west-2a", "us-west-2b"]
    assert requirements["karpenter.sh/capacity-type"] == ["spot", "on-demand"]
    assert requirements["karpenter.sh/nodepool"] == ["default"]
    assert requirements["kubernetes.io/arch"] == ["amd64"]  # the pool's other requirements stay
    assert spec["taints"] == [{"key": "dedicated", "value": "web", "effect": "NoSchedule"}]
    assert spec["terminationGracePeriod"] == "1h"
    meta = body["metadata"]
    assert meta["labels"]["team"] == "web" and meta["annotations"]["karpenter.sh/nodepool-hash"] == "123"
    assert meta["annotations"][REPLACEMENT_FOR_ANNOTATION] == COMMAND
    (owner,) = meta["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("NodePool", "default", "pool-uid")


def test_the_nodeclaim_carries_the_minvalues_the_planner_kept_on_its_pinned_keys_too():
    """pkg/controllers/provisioning/suite_test.go, Context "MinValuesPolicy" / BestEffort: It("should
    schedule even when minValues requirement is not met") expects the NodeClaim's instance-type
    requirement with the lowered minValues 2 and the relaxed annotation "true"."""
    req, pool = request()
    pool["spec"]["template"]["spec"]["requirements"][0]["minValues"] = 2
    pool["spec"]["template"]["spec"]["requirements"].append(
        {"key": "karpenter.k8s.aws/instance-family", "operator": "Exists", "minValues": 3}
    )
    spec = req.spec.model_copy(
        update={
            "offerings": [
                Offering(instance_type="m5.large", zone="us-west-2a", capacity_type="on-demand"),
                Offering(instance_type="c5.large", zone="us-west-2a", capacity_type="on-demand"),
            ],
            "min_values": {"node.kubernetes.io/instance-type": 2, "karpenter.k8s.aws/instance-family": 2},
            "annotations": {"karpenter.sh/nodeclaim-min-values-relaxed": "true"},
        }
    )
    req = req.model_copy(
        update={
            "spec": spec,
            "template": req.template.model_copy(
                update={"annotations": {**req.template.annotations, **spec.annotations}}
            ),
        }
    )
    body = nodeclaim_body(req, pool)
    assert crds.schema_errors(resources.resolve("nodeclaims"), body, None) == []
    by_key = {r["key"]: r for r in body["spec"]["requirements"]}
    assert by_key["node.kubernetes.io/instance-type"] == {
        "key": "node.kubernetes.io/instance-type",
        "operator": "In",
        "values": ["m5.large", "c5.large"],
        "minValues": 2,
    }
    assert by_key["karpenter.k8s.aws/instance-family"]["minValues"] == 2  # lowered from the pool's 3
    assert "minValues" not in by_key["kubernetes.io/arch"]
    assert body["metadata"]["annotations"]["karpenter.sh/nodeclaim-min-values-relaxed"] == "true"


def test_a_reserved_replacement_is_pinned_to_its_reservations():
    # Karpenter's scheduler pins a NodeClaim that reserved offerings to capacity type reserved and to
    # their ReservationIDLabel (nodeclaim.go); beside Karpenter, karpflow's NodeClaim says the same.
    req, pool = request()
    reserved = Offering(
        instance_type="m5.large", zone="us-west-2a", capacity_type="reserved", reservation_id="cr-0abc"
    )
    req = req.model_copy(update={"spec": ReplacementSpec(nodepool="default", offerings=[reserved])})
    body = nodeclaim_body(req, pool)
    assert crds.schema_errors(resources.resolve("nodeclaims"), body, None) == []
    requirements = {r["key"]: r["values"] for r in body["spec"]["requirements"]}
    assert requirements["karpenter.sh/capacity-type"] == ["reserved"]
    assert requirements["karpenter.k8s.aws/capacity-reservation-id"] == ["cr-0abc"]
    # Any other replacement names no reservation.
    req, pool = request()
    keys = {r["key"] for r in nodeclaim_body(req, pool)["spec"]["requirements"]}
    assert "karpenter.k8s.aws/capacity-reservation-id" not in keys


def filled_in(
    name: str, instance_id: str, conditions: list[dict[str, str]], labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """A NodeClaim as Karpenter fills it in: its instance launched, node ip-10-0-1-1 registered."""
    meta: dict[str, Any] = {"name": name, "uid": "u1"}
    if labels is not None:
        meta["labels"] = labels
    return {
        "metadata": meta,
        "status": {
            "providerID": f"aws:///us-west-2a/{instance_id}",
            "nodeName": "ip-10-0-1-1",
            "conditions": conditions,
        },
    }


def test_the_state_reads_what_karpenter_filled_in():
    claim = filled_in(
        "default-0a1b2c",
        "i-0123456789abcdef0",
        [{"type": "Launched", "status": "True"}, {"type": "Initialized", "status": "Unknown"}],
        labels={
            "node.kubernetes.io/instance-type": "m5.large",
            "topology.kubernetes.io/zone": "us-west-2a",
            "karpenter.sh/capacity-type": "spot",
        },
    )
    state = nodeclaim_state(claim)
    assert state.instance_id == "i-0123456789abcdef0" and state.node == "ip-10-0-1-1"
    assert state.offering == Offering(instance_type="m5.large", zone="us-west-2a", capacity_type="spot")
    assert state.conditions == {"Launched": "True", "Initialized": "Unknown"}
    assert nodeclaim_state({"metadata": {"name": "x"}}).offering is None


class OneNodeClaim:
    """The API server's side of one NodeClaim: GET, PUT with resourceVersion, DELETE with UID."""

    def __init__(self, claim: dict[str, Any]) -> None:
        self.claim: dict[str, Any] | None = claim
        self.deleted_with: dict[str, Any] | None = None

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        if self.claim is None:
            raise KubeError(404, "not found")
        if method == "GET":
            return {**self.claim, "metadata": dict(self.claim["metadata"])}
        if method == "PUT":
            self.claim = body
            return body
        if method == "DELETE":
            self.deleted_with = body
            self.claim = None
            return {}
        raise AssertionError(method)


def stamped(deadline: datetime | None) -> dict[str, Any]:
    annotations = (
        {TERMINATION_TIMESTAMP_ANNOTATION: deadline.strftime("%Y-%m-%dT%H:%M:%SZ")} if deadline else {}
    )
    return {"metadata": {"name": "c1", "uid": "u1", "annotations": annotations}}


async def test_a_handover_moves_the_deadline_earlier_never_later_then_deletes_by_uid():
    now = datetime(2026, 1, 1, 12, tzinfo=UTC)
    for existing, ours, kept in [
        (None, now, now),
        (now + timedelta(hours=1), now, now),
        (now, now + timedelta(hours=1), now),  # Karpenter's (or an earlier command's) sooner deadline stays
    ]:
        api = OneNodeClaim(stamped(existing))
        claim = await api.request("GET", "")
        seen: list[str] = []
        original = api.request

        async def spy(method: str, path: str, body: Any = None, original=original, seen=seen) -> Any:
            if method == "PUT":
                seen.append(body["metadata"]["annotations"][TERMINATION_TIMESTAMP_ANNOTATION])
            return await original(method, path, body)

        api.request = spy  # type: ignore[method-assign]
        await KarpenterHandover(api).hand_over(claim, ours)  # type: ignore[arg-type]
        assert api.deleted_with is not None and api.deleted_with["preconditions"] == {"uid": "u1"}
        assert (
            seen[-1]
            if seen
            else stamped(existing)["metadata"]["annotations"].get(TERMINATION_TIMESTAMP_ANNOTATION)
        ) == kept.strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_one_wait_until_initialized_says_in_its_heartbeat_how_far_karpenter_got():
    """The disruption waits once, until Initialized (disruption-nodeclaim-one-wait): whoever looks at
    the pending activity (`temporal workflow describe`, the Web UI) sees the instance Karpenter
    launched and the node that registered, and what Karpenter still waits for."""
    claim = filled_in(
        "c1",
        "i-0abc",
        [
            {"type": "Launched", "status": "True"},
            {"type": "Registered", "status": "True"},
            {"type": "Initialized", "status": "Unknown", "reason": "NotReady", "message": "not ready"},
        ],
    )
    server = OneNodeClaim(claim)
    beats: list[dict[str, Any]] = []

    def beat(*details: Any) -> None:
        beats.append(details[0])
        claim["status"]["conditions"][2]["status"] = "True"  # Karpenter catches up

    env = ActivityEnvironment()
    env.on_heartbeat = beat
    wait = NodeClaimWait(name="c1", uid="u1", until="Initialized", poll_interval_seconds=0.01)
    state = await env.run(NodeClaimActivities(server).await_nodeclaim, wait)  # type: ignore[arg-type]

    assert state.node == "ip-10-0-1-1" and state.instance_id == "i-0abc"
    (first,) = beats
    assert first["nodeclaim"] == "c1" and first["instance"] == "i-0abc" and first["node"] == "ip-10-0-1-1"
    assert "Initialized" in first["waiting_for"], first


class KarpenterDone:
    """The API once Karpenter has finished with a handed-over node: node and NodeClaim gone; the
    NodeDisruptionBudget still holds the claim its command took at the taint."""

    def __init__(self, claims: list[dict[str, Any]]) -> None:
        self.budget = {
            "apiVersion": "karpflow.dev/v1alpha1",
            "kind": "NodeDisruptionBudget",
            "metadata": {"name": "ingress", "resourceVersion": "1"},
            "spec": {"selector": {"matchLabels": {"role": "ingress"}}, "maxUnavailable": 1},
            "status": {"claims": claims},
        }

    async def find_node(self, _name: str) -> None:
        return None

    async def request(self, method: str, path: str, **_: Any) -> Any:
        raise KubeError(404, "NotFound", f"{method} {path}")

    async def list_cluster_custom(self, *_: Any) -> list[dict[str, Any]]:
        return [self.budget]

    async def get_cluster_custom(self, *_: Any) -> dict[str, Any]:
        return self.budget

    async def replace_cluster_custom_status(self, *args: Any) -> dict[str, Any]:
        self.budget = args[-1]
        return self.budget


async def test_a_handed_over_node_gives_its_budget_claims_back_once_karpenter_is_done():
    """Issue 30 item 9: a node handed to Karpenter never reaches karpflow's `remove_finalizer`, which
    releases the claims; they stayed until the controller's sweep."""
    since = "2026-01-01T00:00:00Z"
    mine = {"node": "in-0", "uid": "u0", "holder": f"{COMMAND}@r", "reason": "Drifted", "since": since}
    other = {"node": "in-1", "uid": "u1", "holder": "disruption/x/y@r", "reason": "Drifted", "since": since}
    api = KarpenterDone([mine, other])
    wait = HandoverWait(node="in-0", uid="u0", nodeclaim="default-abc", poll_interval_seconds=0.01)
    done = await ActivityEnvironment().run(NodeClaimActivities(api).await_karpenter_termination, wait)  # type: ignore[arg-type]
    assert "Karpenter drained and terminated node in-0" in done
    assert [c["node"] for c in api.budget["status"]["claims"]] == ["in-1"]
