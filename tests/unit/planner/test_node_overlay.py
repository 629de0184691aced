"""NodeOverlay (api/node_overlay.py, planner/node_overlay.py), written from Karpenter's tests in
kubernetes-sigs/karpenter: pkg/apis/v1alpha1/nodeoverlay_validation_test.go (the CRD's and the
runtime validation) and pkg/controllers/nodeoverlay/suite_test.go (which overlay reaches which
offering, weights, conflicts); each test names the one it comes from. Karpenter's fake instance
types become small catalogs here; `IsPricingOverlayApplied` becomes "the price changed"."""

from __future__ import annotations

from typing import Any

import pytest

from api.node_overlay import read_node_overlay
from api.nodepool import NodePool
from planner.catalog import Catalog, catalog_from_dict
from planner.node_overlay import OverlayResult, adjusted_price, apply_node_overlays, ordered

SPOT_1 = {"zone": "test-zone-1", "capacityType": "spot", "price": 1.020}
OFFERINGS_4 = [
    SPOT_1,
    {"zone": "test-zone-2", "capacityType": "on-demand", "price": 2.020},
    {"zone": "test-zone-3", "capacityType": "spot", "price": 3.020},
    # a reserved offering names its reservation (planner/catalog.py), as Karpenter's fake one does
    {
        "zone": "test-zone-4",
        "capacityType": "reserved",
        "price": 4.020,
        "reservationID": "cr-test",
        "remaining": 1,
    },
]


def catalog(*types: tuple[str, list[dict[str, Any]]], arch: dict[str, str] | None = None) -> Catalog:
    """Karpenter's fake.NewInstanceType: each name with its offerings (4 vCPU, 16 GiB)."""
    return catalog_from_dict(
        {
            "region": "test-region",
            "instanceTypes": [
                {
                    "name": name,
                    "cpu": "4",
                    "memory": "16Gi",
                    "pods": 110,
                    "arch": (arch or {}).get(name, "amd64"),
                    "offerings": offerings,
                }
                for name, offerings in types
            ],
        }
    )


DEFAULT = catalog(("default-instance-type", [SPOT_1]))


def pool(name: str = "default", labels: dict[str, str] | None = None) -> NodePool:
    return NodePool.model_validate(
        {"metadata": {"name": name}, "spec": {"template": {"metadata": {"labels": labels or {}}, "spec": {}}}}
    )


def overlay(
    name: str, requirements: list[dict[str, Any]], weight: int | None = 10, **spec: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {"requirements": requirements, **spec}
    if weight is not None:
        body["weight"] = weight
    return {
        "apiVersion": "karpenter.sh/v1alpha1",
        "kind": "NodeOverlay",
        "metadata": {"name": name},
        "spec": body,
    }


def types_in(key: str, *values: str) -> list[dict[str, Any]]:
    return [{"key": key, "operator": "In", "values": list(values)}]


INSTANCE_TYPE = "node.kubernetes.io/instance-type"
ZONE = "topology.kubernetes.io/zone"
CAPACITY_TYPE = "karpenter.sh/capacity-type"


def apply(
    objects: list[dict[str, Any]], cat: Catalog = DEFAULT, pools: list[NodePool] | None = None
) -> OverlayResult:
    return apply_node_overlays(cat, [read_node_overlay(o) for o in objects], pools or [pool()])


def prices(
    result: OverlayResult, cat: Catalog, pool_name: str = "default", type_name: str = "default-instance-type"
):
    view = result.views.get(pool_name, cat)
    return {(o.zone, o.capacity_type): o.price for o in view.types[type_name].offerings}


def conflicted(result: OverlayResult) -> list[str]:
    return sorted(
        p.split(":")[0].removeprefix("NodeOverlay ") for p in result.problems if "conflicts with" in p
    )


def invalid(spec: dict[str, Any], requirements: list[dict[str, Any]] | None = None) -> tuple[str, ...]:
    """The problems of an overlay with this spec (Exists on the capacity type unless told)."""
    reqs = requirements if requirements is not None else [{"key": CAPACITY_TYPE, "operator": "Exists"}]
    return read_node_overlay(overlay("o", reqs, weight=None, **spec)).problems


# --- nodeoverlay_validation_test.go: the CRD's rules and RuntimeValidate ------------------------------


@pytest.mark.parametrize("operator", ["In", "NotIn"])
def test_in_and_not_in_need_values(operator):
    # Context("Requirements") "should fail for no values for In operator" / "... NotIn operator"
    assert invalid({}, [{"key": "Test", "operator": operator}])


def test_valid_requirement_keys_are_accepted():
    # Context("Requirements") "should succeed for valid requirement keys"
    keys = ["Test", "test.com/Test", "test.com.com/test", "key-only"]
    assert invalid({}, [{"key": key, "operator": "Exists"} for key in keys]) == ()


@pytest.mark.parametrize("key", ["test.com.com}", "Test.com/test", "test/test/test", "test/", "/test"])
def test_invalid_requirement_keys_are_refused(key):
    # Context("Requirements") "should fail for invalid requirement keys"
    assert invalid({}, [{"key": key, "operator": "Exists"}])


def test_requirement_keys_that_are_too_long_fail_runtime_validation():
    # Context("Requirements") "should fail at runtime for requirement keys that are too long"
    assert invalid({}, [{"key": f"test.com.test.{'a' * 250}/test", "operator": "Exists"}])
    assert invalid({}, [{"key": f"test.com.test/test-{'a' * 250}", "operator": "Exists"}])


def test_restricted_domains_are_refused_and_the_nodepool_label_is_allowed():
    # "should fail for restricted domains", "should allow for the karpenter.sh/nodepool label",
    # "should allow kubernetes domains exceptions" / "... subdomains exceptions"
    assert invalid({}, [{"key": "karpenter.sh/test", "operator": "In", "values": ["test"]}])
    assert invalid({}, [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["test"]}])
    for key in ("karpenter.sh/nodepool", "kubernetes.io/test", "k8s.io/test", "subdomain.kubernetes.io/test"):
        assert invalid({}, [{"key": key, "operator": "In", "values": ["test"]}]) == (), key


def test_supported_operators_and_an_overlapping_set_are_accepted():
    # "should allow supported ops", "should allow non-empty set after removing overlapped value"
    reqs = [
        {"key": ZONE, "operator": op, "values": ["1"]} for op in ("In", "Gt", "Lt", "Gte", "Lte", "NotIn")
    ]
    assert invalid({}, [*reqs, {"key": ZONE, "operator": "Exists"}]) == ()
    assert invalid(
        {}, [{"key": ZONE, "operator": "Unknown", "values": ["test"]}]
    )  # "should fail for unsupported ops"


@pytest.mark.parametrize("operator", ["Gt", "Lt", "Gte", "Lte"])
@pytest.mark.parametrize("values", [[], ["1", "2"], ["a"], ["-1"]])
def test_bounds_need_one_non_negative_integer(operator, values):
    # "should fail with invalid GT or LT values" / "should fail with invalid GTE or LTE values"
    assert invalid({}, [{"key": ZONE, "operator": operator, "values": values}])


def test_price_and_price_adjustment_are_exclusive():
    # It("shout not be able to set both price and priceAdjustment")
    assert invalid({"price": "0.432", "priceAdjustment": "+10%"})


BAD_NUMBERS = [
    "+42",
    ".5",
    "42.",
    "42%",
    "3,14",
    "1e10",
    "0x42",
    "forty-two",
    "42a",
    "42 ",
    " 42",
    "42.0.0",
    "-",
    ".",
]


@pytest.mark.parametrize("value", [*BAD_NUMBERS, "-.42"])
def test_invalid_prices_are_refused(value):
    # Context("price") DescribeTable("Invalid Input")
    assert invalid({"price": value})


@pytest.mark.parametrize("value", ["43", "34.43"])
def test_valid_prices_are_accepted(value):
    # Context("price") "should allow integer value" / "should allow float value"
    assert invalid({"price": value}) == ()


@pytest.mark.parametrize(
    "value", [*[v for v in BAD_NUMBERS if v != "+42"], "-100.0%", "-101.1%", "1%", "1", "1.3"]
)
def test_invalid_price_adjustments_are_refused(value):
    # Context("priceAdjustment") DescribeTable("Invalid Input"), "should not allow an unsigned
    # priceAdjustment percentage / integer / float" (the table gives these as spec.price; karpflow
    # checks them as priceAdjustment, whose pattern refuses them too, but for signed numbers)
    assert invalid({"priceAdjustment": value})


@pytest.mark.parametrize(
    "value", ["+1%", "-1%", "-100%", "+100.102%", "+298%", "+43", "-43", "+34.43", "-34.43"]
)
def test_valid_price_adjustments_are_accepted(value):
    # Context("priceAdjustment"): "should allow positive percentage value", "... negative percentage
    # less then 0%", "... -100%", "... greater then 100%", "... with an integer", "... positive /
    # negative integer value", "... positive / negative float value"
    assert invalid({"priceAdjustment": value}) == ()


@pytest.mark.parametrize("resource", ["cpu", "memory", "pods", "ephemeral-storage"])
def test_capacity_may_not_override_well_known_resources(resource):
    # Context("Capacity") "should not allow cpu / memory / pod resources override"
    assert invalid({"capacity": {resource: "1"}})


def test_capacity_may_add_custom_resources():
    # Context("Capacity") "should allow custom resources"
    assert invalid({"capacity": {"smarter-devices/fuse": "1"}}) == ()


# --- AdjustedPrice (pkg/cloudprovider/types.go) -----------------------------------------------------------


def test_adjusted_price():
    assert adjusted_price(1.02, "5.00") == 5.0
    assert adjusted_price(1.02, "+1000") == pytest.approx(1001.02)
    assert adjusted_price(4.02, "-1.5") == pytest.approx(2.52)
    assert adjusted_price(2.0, "-10%") == pytest.approx(1.8)
    assert adjusted_price(2.0, "+15%") == pytest.approx(2.3)
    assert adjusted_price(2.0, "-100%") == 0.0
    assert adjusted_price(1.02, "-5") == 0.0  # never below 0


def test_order_by_weight_then_the_later_name():
    # v1alpha1 NodeOverlayList.OrderByWeight: the larger weight first; equal weights, the name later
    # in the alphabet first
    read = [
        read_node_overlay(overlay(n, [], weight=w)).overlay
        for n, w in (("a", 10), ("b", 10), ("c", None), ("d", 20))
    ]
    assert [o.name for o in ordered(o for o in read if o is not None)] == ["d", "b", "a", "c"]


# --- suite_test.go Describe("Validation") ---------------------------------------------------------------


def test_zero_overlays_leave_the_instance_types_as_they_are():
    # "should return the same instance type when zero overlay are applied"
    result = apply([])
    assert result.views == {} and prices(result, DEFAULT) == {("test-zone-1", "spot"): 1.020}


def test_a_single_overlay_applies():
    # "should pass with a single overlay"
    result = apply([overlay("o", types_in(INSTANCE_TYPE, "default-instance-type"), price="2")])
    assert result.problems == [] and prices(result, DEFAULT) == {("test-zone-1", "spot"): 2.0}


def test_an_overlay_that_fails_runtime_validation_is_not_applied_and_is_reported():
    # Context("Runtime Validation") "should fail validation for invalid requirements values"; and
    # DescribeTable("should not apply pricing updates for invalid overlays")
    long_key = f"test.com.test/test-{'a' * 250}"
    result = apply([overlay("bad", [{"key": long_key, "operator": "Exists"}], price="13234.223")])
    assert prices(result, DEFAULT) == {("test-zone-1", "spot"): 1.020}
    assert len(result.problems) == 1 and result.problems[0].startswith("NodeOverlay bad: ")
    assert "not applied" in result.problems[0]
    # karpflow fails closed where Karpenter fails open: the pools it may reach do not consolidate
    assert list(result.held) == ["default"]


def test_overlapping_requirements_of_equal_weight_conflict_and_the_later_name_wins():
    # Context("Requirements Validations") "Instance types Requirements" "should fail when requirements
    # overlays overlap": overlay-a (arch arm64) and overlay-b (capacity type Exists), both weight 10
    arm = catalog(("default-instance-type", [SPOT_1]), arch={"default-instance-type": "arm64"})
    result = apply(
        [
            overlay("overlay-a", types_in("kubernetes.io/arch", "arm64"), price="1.03"),
            overlay("overlay-b", [{"key": CAPACITY_TYPE, "operator": "Exists"}], price="23"),
        ],
        arm,
    )
    assert conflicted(result) == ["overlay-a"]
    assert prices(result, arm) == {("test-zone-1", "spot"): 23.0}


def test_requirements_that_do_not_overlap_both_apply():
    # "Instance types Requirements" "should succeed with requirements overlays don't overlap"
    # (Karpenter's types differ by arch and OS; karpflow's types are all linux, so by arch alone)
    cat = catalog(
        ("arm-instance-type", [SPOT_1]), ("amd-instance-type", [SPOT_1]), arch={"arm-instance-type": "arm64"}
    )
    result = apply(
        [
            overlay("overlay-a", types_in("kubernetes.io/arch", "arm64"), price="1.03"),
            overlay("overlay-b", types_in("kubernetes.io/arch", "amd64"), price="23"),
        ],
        cat,
    )
    assert result.problems == []
    assert prices(result, cat, type_name="arm-instance-type") == {("test-zone-1", "spot"): 1.03}
    assert prices(result, cat, type_name="amd-instance-type") == {("test-zone-1", "spot"): 23.0}


FOUR = catalog(("default-instance-type", OFFERINGS_4))


@pytest.mark.parametrize(
    ("requirements_a", "requirements_b", "conflict"),
    [
        # "Offering Requirements" "should fail with requirements overlays overlap on zone"
        (types_in(ZONE, "test-zone-1", "test-zone-2"), types_in(ZONE, "test-zone-2", "test-zone-3"), True),
        # ... "should fail with requirements overlays overlap on capacity type"
        (types_in(CAPACITY_TYPE, "spot"), types_in(CAPACITY_TYPE, "spot", "reserved"), True),
        # ... "should succeed with requirements overlays don't overlap"
        (types_in(ZONE, "test-zone-1"), types_in(ZONE, "test-zone-2"), False),
    ],
)
def test_offering_requirements_conflict_only_where_they_overlap(requirements_a, requirements_b, conflict):
    result = apply(
        [overlay("overlay-a", requirements_a, price="10"), overlay("overlay-b", requirements_b, price="20")],
        FOUR,
    )
    assert conflicted(result) == (["overlay-a"] if conflict else [])


# --- suite_test.go Context("Pricing Updates") -------------------------------------------------------------

THREE = catalog(
    ("default-instance-type", [SPOT_1]),
    ("small-instance-type", [SPOT_1]),
    ("gpu-vendor-instance-type", [SPOT_1]),
)


@pytest.mark.parametrize(
    ("change_a", "change_b"),
    [({"price": "1.03"}, {"price": "23"}), ({"priceAdjustment": "+54"}, {"priceAdjustment": "-2"})],
)
def test_pricing_updates_of_equal_weight_on_a_shared_type_conflict(change_a, change_b):
    # DescribeTable("should fail with conflicting pricing updates overlays with overlapping requirements")
    result = apply(
        [
            overlay(
                "overlay-a",
                types_in(INSTANCE_TYPE, "default-instance-type", "small-instance-type"),
                **change_a,
            ),
            overlay(
                "overlay-b",
                types_in(INSTANCE_TYPE, "default-instance-type", "gpu-vendor-instance-type"),
                **change_b,
            ),
        ],
        THREE,
    )
    assert conflicted(result) == ["overlay-a"]
    # overlay-a is applied nowhere, not even to the type only it selects
    assert prices(result, THREE, type_name="small-instance-type") == {("test-zone-1", "spot"): 1.020}


def test_identical_pricing_updates_of_equal_weight_still_conflict():
    # DescribeTable("should fail with pricing updates are the same overlays with overlapping requirements")
    result = apply(
        [
            overlay(
                "overlay-a",
                types_in(INSTANCE_TYPE, "default-instance-type", "small-instance-type"),
                price="100",
            ),
            overlay(
                "overlay-b",
                types_in(INSTANCE_TYPE, "default-instance-type", "gpu-vendor-instance-type"),
                price="100",
            ),
        ],
        THREE,
    )
    assert conflicted(result) == ["overlay-a"]


@pytest.mark.parametrize(
    ("change_a", "change_b", "expected"),
    [({"price": "34"}, {"price": "2"}, 34.0), ({"priceAdjustment": "-4"}, {"priceAdjustment": "-0.5"}, 0.0)],
)
def test_pricing_updates_of_different_weights_do_not_conflict_and_the_heavier_wins(
    change_a, change_b, expected
):
    # DescribeTable("should pass with conflicting pricing update overlays with mutually exclusive weights")
    result = apply(
        [
            overlay("overlay-a", types_in(INSTANCE_TYPE, "default-instance-type"), weight=20, **change_a),
            overlay("overlay-b", types_in(INSTANCE_TYPE, "default-instance-type"), weight=10, **change_b),
        ]
    )
    assert result.problems == []
    assert prices(result, DEFAULT) == {("test-zone-1", "spot"): pytest.approx(expected)}


@pytest.mark.parametrize(
    ("change_one", "change_two", "one", "two"),
    [
        ({"price": "13234.223"}, {"price": "232.11"}, 13234.223, 232.11),
        ({"priceAdjustment": "+1000"}, {"priceAdjustment": "+2500"}, 1001.020, 2501.020),
    ],
)
def test_each_nodepool_gets_the_overlay_naming_it(change_one, change_two, one, two):
    # Context("Price Updates") DescribeTable("should pass with conflicting pricing update overlays for all
    # nodepools"): equal weights, but the karpenter.sh/nodepool requirement keeps them apart
    result = apply(
        [
            overlay("a", types_in("karpenter.sh/nodepool", "one"), **change_one),
            overlay("b", types_in("karpenter.sh/nodepool", "two"), **change_two),
        ],
        pools=[pool("one"), pool("two")],
    )
    assert result.problems == []
    assert prices(result, DEFAULT, "one") == {("test-zone-1", "spot"): pytest.approx(one)}
    assert prices(result, DEFAULT, "two") == {("test-zone-1", "spot"): pytest.approx(two)}


def test_a_nodepool_template_label_selects_that_pool_only():
    # DescribeTable("should only apply pricing updates for nodeclaim spec labels that defined in the
    # overlay requirements")
    result = apply(
        [overlay("o", types_in("test-label", "test-value"), priceAdjustment="+1000")],
        pools=[pool("one"), pool("two", {"test-label": "test-value"})],
    )
    assert "one" not in result.views
    assert prices(result, DEFAULT, "two") == {("test-zone-1", "spot"): pytest.approx(1001.020)}


def test_requirements_that_do_not_fit_the_instance_types_change_nothing():
    # DescribeTable("should not apply adjustments for overlays that do not overlap with instance types
    # requirements")
    result = apply([overlay("o", types_in(INSTANCE_TYPE, "unknown-type"), price="13234.223")])
    assert result.views == {} and result.problems == []


@pytest.mark.parametrize(
    ("requirements", "changed"),
    [
        # DescribeTable("should apply pricing updates for instances types for capacity type")
        (types_in(CAPACITY_TYPE, "on-demand"), {("test-zone-2", "on-demand")}),
        # DescribeTable("should apply pricing updates for instances types for availability zone")
        (types_in(ZONE, "test-zone-1"), {("test-zone-1", "spot")}),
    ],
)
def test_only_the_offerings_the_requirements_allow_are_priced(requirements, changed):
    result = apply([overlay("o", requirements, priceAdjustment="+1000")], FOUR)
    base = prices(OverlayResult(), FOUR)
    after = prices(result, FOUR)
    assert {key for key in after if after[key] != base[key]} == changed
    for key in changed:
        assert after[key] == pytest.approx(base[key] + 1000)


@pytest.mark.parametrize(
    ("change_a", "change_b", "zone_2", "zone_4"),
    [
        ({"price": "121.421"}, {"price": "165.421"}, 121.421, 165.421),
        ({"priceAdjustment": "+201"}, {"priceAdjustment": "-1.5"}, 203.020, 2.520),
    ],
)
def test_offerings_priced_by_several_overlays_of_different_weights(change_a, change_b, zone_2, zone_4):
    # DescribeTable("should update price updates offerings instance types from multiple overlays with
    # different weights"): a-test-100 (weight 20, zone 2) and b-test-100 (weight 10, zones 2 and 4)
    cat = catalog(("default-instance-type", [o for o in OFFERINGS_4 if o["zone"] != "test-zone-3"]))
    result = apply(
        [
            overlay("a-test-100", types_in(ZONE, "test-zone-2"), weight=20, **change_a),
            overlay("b-test-100", types_in(ZONE, "test-zone-2", "test-zone-4"), weight=10, **change_b),
        ],
        cat,
    )
    after = prices(result, cat)
    assert after[("test-zone-2", "on-demand")] == pytest.approx(zone_2)
    assert after[("test-zone-4", "reserved")] == pytest.approx(zone_4)
    assert after[("test-zone-1", "spot")] == 1.020
    assert result.priced_by("default", "default-instance-type", "test-zone-2", "on-demand") == "a-test-100"
    assert result.priced_by("default", "default-instance-type", "test-zone-4", "reserved") == "b-test-100"
    assert result.priced_by("default", "default-instance-type", "test-zone-1", "spot") is None


def test_a_lighter_overlay_on_a_priced_offering_is_what_the_next_one_of_its_weight_conflicts_with():
    # store.go updateInstanceTypeOffering: the heavier price stays, the weight compared with next drops
    # to the lighter overlay's (isOfferingUpdateConflicting), so two weight-10 overlays under a
    # weight-20 one conflict with each other
    result = apply(
        [
            overlay("heavy", [], weight=20, price="5"),
            overlay("light-a", [], weight=10, price="6"),
            overlay("light-b", [], weight=10, price="7"),
        ]
    )
    assert conflicted(result) == ["light-a"]
    assert "NodeOverlay light-b" in result.problems[0]
    assert prices(result, DEFAULT) == {("test-zone-1", "spot"): 5.0}


def test_a_conflicting_overlay_is_not_applied_to_any_of_its_types():
    # DescribeTable("should not partial apply instance types in a nodepool"): overlay-b (later name)
    # takes small and gpu-vendor; overlay-a conflicts on small and changes none of its types
    cat = catalog(
        ("default-instance-type", [SPOT_1]),
        ("small-instance-type", [SPOT_1]),
        ("gpu-vendor-instance-type", [SPOT_1]),
        ("gpu-vendor-b-instance-type", [SPOT_1]),
    )
    result = apply(
        [
            overlay(
                "overlay-a",
                types_in(
                    INSTANCE_TYPE,
                    "default-instance-type",
                    "small-instance-type",
                    "gpu-vendor-b-instance-type",
                ),
                price="382",
            ),
            overlay(
                "overlay-b",
                types_in(INSTANCE_TYPE, "small-instance-type", "gpu-vendor-instance-type"),
                price="100",
            ),
        ],
        cat,
    )
    assert conflicted(result) == ["overlay-a"]
    changed = {n for n in cat.types if prices(result, cat, type_name=n) != {("test-zone-1", "spot"): 1.020}}
    assert changed == {"small-instance-type", "gpu-vendor-instance-type"}


def test_a_conflict_in_one_nodepool_keeps_the_overlay_out_of_every_nodepool():
    # DescribeTable("should not partial apply for a subset of nodepools")
    result = apply(
        [
            overlay("overlay-a", [], price="382"),
            overlay("overlay-b", types_in("karpenter.sh/nodepool", "two"), price="100"),
        ],
        pools=[pool("one"), pool("two")],
    )
    assert conflicted(result) == ["overlay-a"]
    assert "one" not in result.views
    assert prices(result, DEFAULT, "two") == {("test-zone-1", "spot"): 100.0}
    assert sorted(result.held) == ["one", "two"]  # overlay-a reaches both


# --- suite_test.go Context("Capacity Adjustment") / Context("Capacity") -----------------------------------

TWO = catalog(("default-instance-type", [SPOT_1]), ("small-instance-type", [SPOT_1]))


def extended(result: OverlayResult, cat: Catalog, type_name: str = "default-instance-type") -> dict[str, int]:
    return dict(result.views.get("default", cat).types[type_name].capacity_resources.extended)


def test_capacity_overlays_conflict_on_a_shared_resource_of_equal_weight():
    # It("should fail with conflicting capacity overlays with multiple overlays")
    result = apply(
        [
            overlay(
                "conflicting-overlay-1",
                types_in(INSTANCE_TYPE, "default-instance-type", "small-instance-type"),
                capacity={"hugepage-1Gi": "2Gi"},
            ),
            overlay(
                "good-overlay-1",
                types_in(INSTANCE_TYPE, "default-instance-type"),
                capacity={"smarter-devices/fuse": "1"},
            ),
            overlay(
                "conflicting-overlay-2",
                types_in(INSTANCE_TYPE, "default-instance-type"),
                capacity={"hugepage-1Gi": "3Gi"},
            ),
        ],
        TWO,
    )
    assert conflicted(result) == ["conflicting-overlay-1"]
    assert extended(result, TWO) == {"smarter-devices/fuse": 1, "hugepage-1Gi": 3 << 30}
    assert extended(result, TWO, "small-instance-type") == {}


def test_capacity_conflicts_are_judged_against_the_last_capacity_overlay_only():
    # store.go isCapacityUpdateConflicting compares with lowestWeightCapacityResources, the resources
    # of the last capacity overlay stored on the type: c (fuse), then b (hugepages), then a (fuse
    # again) does not conflict, and c's fuse stays
    result = apply(
        [
            overlay(
                "a", types_in(INSTANCE_TYPE, "default-instance-type"), capacity={"smarter-devices/fuse": "3"}
            ),
            overlay("b", types_in(INSTANCE_TYPE, "default-instance-type"), capacity={"hugepages-1Gi": "2Gi"}),
            overlay(
                "c", types_in(INSTANCE_TYPE, "default-instance-type"), capacity={"smarter-devices/fuse": "1"}
            ),
        ]
    )
    assert result.problems == []
    assert extended(result, DEFAULT) == {"smarter-devices/fuse": 1, "hugepages-1Gi": 2 << 30}


def test_capacity_of_several_overlays_is_merged():
    # It("should update capacity for one instance types from multiple overlays")
    result = apply(
        [
            overlay(
                "a", types_in(INSTANCE_TYPE, "default-instance-type"), capacity={"smarter-devices/fuse": "1"}
            ),
            overlay("b", types_in(INSTANCE_TYPE, "default-instance-type"), capacity={"hugepages-1Gi": "2Gi"}),
        ]
    )
    assert result.problems == []
    assert extended(result, DEFAULT) == {"smarter-devices/fuse": 1, "hugepages-1Gi": 2 << 30}
    assert prices(result, DEFAULT) == {("test-zone-1", "spot"): 1.020}


def test_the_heavier_capacity_overlay_wins_a_resource():
    # It("should apply higher weight overlay when multiple overlays match the same instance type")
    result = apply(
        [
            overlay(
                "overlay-a",
                types_in(INSTANCE_TYPE, "default-instance-type"),
                capacity={"smarter-devices/fuse": "5"},
            ),
            overlay(
                "overlay-b",
                types_in(INSTANCE_TYPE, "default-instance-type"),
                weight=20,
                capacity={"smarter-devices/fuse": "99"},
            ),
        ]
    )
    assert result.problems == [] and extended(result, DEFAULT) == {"smarter-devices/fuse": 99}


def test_price_and_capacity_from_two_overlays_on_one_type():
    # It("should apply pricing and capacity adjustment from two overlays on the same instance type")
    result = apply(
        [
            overlay("price", types_in(INSTANCE_TYPE, "default-instance-type"), priceAdjustment="-50%"),
            overlay(
                "capacity",
                types_in(INSTANCE_TYPE, "default-instance-type"),
                capacity={"smarter-devices/fuse": "1"},
            ),
        ]
    )
    assert result.problems == []
    assert prices(result, DEFAULT) == {("test-zone-1", "spot"): pytest.approx(0.51)}
    view = result.views["default"].types["default-instance-type"]
    # extended resources are added to capacity and allocatable; the core resources are untouched
    assert view.allocatable_resources.extended == {"smarter-devices/fuse": 1}
    assert view.allocatable_resources.cpu == DEFAULT.types["default-instance-type"].allocatable_resources.cpu


def test_the_notes_name_each_applied_overlay():
    result = apply([overlay("o", [], price="2")], TWO)
    assert result.notes == ["NodeOverlay o: 2 instance type(s) in NodePool(s) default"]
