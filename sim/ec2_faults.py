"""EC2 faults for the simulator: capacity errors, throttling and instances that never become ready.

moto accepts every launch and never throttles, so the failures karpflow must survive are injected
here, inside the moto server's own process, by wrapping three moto EC2 response handlers:

- `RunInstances` fails with the real error code `InsufficientInstanceCapacity` (HTTP 400 here, so
  botocore does not retry it) when the requested (instance type, zone, capacity type) is an exhausted pool.
- `CreateFleet` behaves like EC2's *instant* fleet: exhausted overrides are dropped and reported
  in the response's `Errors[]` (ErrorCode `InsufficientInstanceCapacity`, with the override and
  lifecycle), the rest is launched; when every override is exhausted the call still succeeds with
  no instances and only `Errors[]` — which is what Karpenter reads. moto itself never fills
  `Errors[]`.
- Any EC2 action can fail with `RequestLimitExceeded` (HTTP 503, which botocore retries), by
  probability and/or a token bucket per action. Requests carrying the header
  `X-Karpflow-Sim: controllers` (the simulator's own pollers) are never throttled, so a throttle
  storm hits karpflow, not the simulated kubelets.

"Never becomes ready" is not an EC2 error: the node lifecycle controller asks
`Ec2Faults.is_never_ready(instance)` (by instance id, instance type, image id, predicate, or the
instance tag `karpflow.io/sim-never-ready=true`) and registers such an instance as a node that stays
NotReady. A bad AMI (`karpflow sim faults bad-ami AMI_ID`) is either that, for every instance booted
from the image, or one whose kubelet comes up but whose pods crash-loop
(`Ec2Faults.is_crash_looping(instance)`, read by the simulated kubelets: sim/controllers/kubelet.py).

Zones are matched as requested: run_instances takes `Placement.AvailabilityZone`, else the
subnet's zone, else moto's default (`<region>a`); a fleet override takes its `AvailabilityZone`,
else its (or the launch template's) subnet's zone. moto places fleet instances by subnet only, so
launchers should pass `SubnetId` overrides (Karpenter does).

moto keeps one backend per process, so there is one active `Ec2Faults` per process too:
`install(faults)` wraps moto once and makes `faults` the active set (installs nest, see
`uninstall`); an empty set changes nothing.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field, field_validator

from api.constants import CAPACITY_ON_DEMAND, CAPACITY_SPOT

NEVER_READY_TAG = "karpflow.io/sim-never-ready"
# Header the simulator's own EC2 clients send so that injected throttling skips them.
SIM_CLIENT_HEADER = "X-Karpflow-Sim"
SIM_CLIENT_VALUE = "controllers"

ICE_CODE = "InsufficientInstanceCapacity"
THROTTLE_CODE = "RequestLimitExceeded"
_CAPACITY_TYPES = (CAPACITY_ON_DEMAND, CAPACITY_SPOT)
_TEMPLATE_REF_KEYS = ("LaunchTemplateId", "LaunchTemplateName", "Version")


# --- the fault description (what the HTTP endpoints read and write) -------------------------------


class CapacityPool(BaseModel):
    """An exhausted pool. A field left empty matches any value (e.g. every zone)."""

    instance_type: str
    zone: str | None = None
    capacity_type: str | None = None

    @field_validator("capacity_type")
    @classmethod
    def _known_capacity_type(cls, value: str | None) -> str | None:
        if value is not None and value not in _CAPACITY_TYPES:
            raise ValueError(f"capacity_type must be one of {_CAPACITY_TYPES}, got {value!r}")
        return value

    def matches(self, instance_type: str, zone: str | None, capacity_type: str) -> bool:
        return (
            self.instance_type == instance_type
            and (self.zone is None or self.zone == zone)
            and (self.capacity_type is None or self.capacity_type == capacity_type)
        )


class ThrottleSpec(BaseModel):
    """`RequestLimitExceeded` for a fraction of calls and/or above a rate, per action.

    `probability` fails that fraction of calls at random (seeded, so runs repeat). With
    `requests_per_second` each action has its own token bucket of `burst` tokens refilled at that
    rate, like EC2's per-action request throttling. `actions` limits both to the named API
    actions (e.g. "RunInstances", "CreateFleet"); empty means every EC2 action.
    """

    probability: float = Field(default=0.0, ge=0.0, le=1.0)
    requests_per_second: float | None = Field(default=None, gt=0)
    burst: int = Field(default=10, ge=1)
    actions: list[str] = Field(default_factory=list)
    seed: int | None = None

    @property
    def active(self) -> bool:
        return self.probability > 0 or self.requests_per_second is not None


class NeverReadySpec(BaseModel):
    """Instances whose node registers but never turns Ready."""

    instance_ids: list[str] = Field(default_factory=list)
    instance_types: list[str] = Field(default_factory=list)
    image_ids: list[str] = Field(default_factory=list, description="bad AMIs: their nodes never turn Ready")


class CrashLoopSpec(BaseModel):
    """Bad AMIs whose nodes turn Ready but whose pods' containers exit at once, again and again."""

    image_ids: list[str] = Field(default_factory=list)


class Ec2FaultSpec(BaseModel):
    """Every injected EC2 fault, as JSON for `/sim/ec2/faults`."""

    insufficient_capacity: list[CapacityPool] = Field(default_factory=list)
    throttle: ThrottleSpec = Field(default_factory=ThrottleSpec)
    never_ready: NeverReadySpec = Field(default_factory=NeverReadySpec)
    crash_loop: CrashLoopSpec = Field(default_factory=CrashLoopSpec)


@dataclass
class FaultCounters:
    insufficient_capacity: int = 0
    throttled: int = 0


class Ec2Faults:
    """The live fault set. Thread-safe: moto serves requests on its own threads."""

    def __init__(self, spec: Ec2FaultSpec | None = None) -> None:
        self._lock = threading.Lock()
        self._spec = Ec2FaultSpec()
        self._rng = random.Random()
        self._buckets: dict[str, tuple[float, float]] = {}  # action -> (tokens, last refill)
        self._predicates: list[Callable[[Mapping[str, Any]], bool]] = []
        self.counters = FaultCounters()
        if spec is not None:
            self.replace(spec)

    # --- configuration -----------------------------------------------------------------------

    def spec(self) -> Ec2FaultSpec:
        with self._lock:
            return self._spec.model_copy(deep=True)

    def replace(self, spec: Ec2FaultSpec | Mapping[str, Any]) -> Ec2FaultSpec:
        """Set every fault at once (the body of `PUT /sim/ec2/faults`). Predicates are kept."""
        parsed = spec if isinstance(spec, Ec2FaultSpec) else Ec2FaultSpec.model_validate(spec)
        with self._lock:
            self._spec = parsed.model_copy(deep=True)
            self._rng = random.Random(parsed.throttle.seed)
            self._buckets.clear()
        return self.spec()

    def clear(self) -> None:
        """No faults at all, predicates and counters included."""
        with self._lock:
            self._spec = Ec2FaultSpec()
            self._buckets.clear()
            self._predicates.clear()
            self.counters = FaultCounters()

    def add_insufficient_capacity(
        self, instance_type: str, zone: str | None = None, capacity_type: str | None = None
    ) -> CapacityPool:
        pool = CapacityPool(instance_type=instance_type, zone=zone, capacity_type=capacity_type)
        with self._lock:
            if pool not in self._spec.insufficient_capacity:
                self._spec.insufficient_capacity.append(pool)
        return pool

    def remove_insufficient_capacity(
        self, instance_type: str, zone: str | None = None, capacity_type: str | None = None
    ) -> bool:
        pool = CapacityPool(instance_type=instance_type, zone=zone, capacity_type=capacity_type)
        with self._lock:
            before = len(self._spec.insufficient_capacity)
            self._spec.insufficient_capacity = [p for p in self._spec.insufficient_capacity if p != pool]
            return len(self._spec.insufficient_capacity) != before

    def set_throttle(
        self,
        probability: float = 0.0,
        requests_per_second: float | None = None,
        burst: int = 10,
        actions: Iterable[str] = (),
        seed: int | None = None,
    ) -> ThrottleSpec:
        spec = ThrottleSpec(
            probability=probability,
            requests_per_second=requests_per_second,
            burst=burst,
            actions=list(actions),
            seed=seed,
        )
        with self._lock:
            self._spec.throttle = spec
            self._rng = random.Random(seed)
            self._buckets.clear()
        return spec

    def add_never_ready(
        self,
        instance_ids: Iterable[str] = (),
        instance_types: Iterable[str] = (),
        predicate: Callable[[Mapping[str, Any]], bool] | None = None,
    ) -> None:
        """Mark instances whose node will stay NotReady; the predicate sees the DescribeInstances dict."""
        with self._lock:
            spec = self._spec.never_ready
            spec.instance_ids.extend(i for i in instance_ids if i not in spec.instance_ids)
            spec.instance_types.extend(t for t in instance_types if t not in spec.instance_types)
            if predicate is not None:
                self._predicates.append(predicate)

    def add_bad_image(self, image_id: str, *, crash_loop: bool = False) -> None:
        """Instances booted from `image_id` never turn Ready, or (`crash_loop`) their pods crash-loop."""
        with self._lock:
            images = self._spec.crash_loop.image_ids if crash_loop else self._spec.never_ready.image_ids
            if image_id not in images:
                images.append(image_id)

    # --- queries -----------------------------------------------------------------------------

    def exhausted(self, instance_type: str, zone: str | None, capacity_type: str) -> bool:
        with self._lock:
            pools = self._spec.insufficient_capacity
            return any(p.matches(instance_type, zone, capacity_type) for p in pools)

    def is_never_ready(self, instance: Mapping[str, Any]) -> bool:
        """`instance` is one DescribeInstances instance (boto3 shape)."""
        tags = {t.get("Key"): t.get("Value") for t in instance.get("Tags") or ()}
        if str(tags.get(NEVER_READY_TAG, "")).lower() == "true":
            return True
        with self._lock:
            spec = self._spec.never_ready
            if instance.get("InstanceId") in spec.instance_ids:
                return True
            if instance.get("InstanceType") in spec.instance_types:
                return True
            if instance.get("ImageId") in spec.image_ids:
                return True
            predicates = list(self._predicates)
        return any(p(instance) for p in predicates)

    def is_crash_looping(self, instance: Mapping[str, Any]) -> bool:
        """Whether the pods of `instance`'s node crash-loop (it was booted from a crash-loop AMI)."""
        with self._lock:
            return bool(instance) and instance.get("ImageId") in self._spec.crash_loop.image_ids

    def should_throttle(self, action: str) -> bool:
        with self._lock:
            throttle = self._spec.throttle
            if not throttle.active or (throttle.actions and action not in throttle.actions):
                return False
            throttled = throttle.probability > 0 and self._rng.random() < throttle.probability
            if not throttled and throttle.requests_per_second is not None:
                throttled = not self._take_token(action, throttle)
            if throttled:
                self.counters.throttled += 1
            return throttled

    def _take_token(self, action: str, throttle: ThrottleSpec) -> bool:
        now = time.monotonic()
        tokens, last = self._buckets.get(action, (float(throttle.burst), now))
        tokens = min(float(throttle.burst), tokens + (now - last) * (throttle.requests_per_second or 0))
        if tokens >= 1:
            self._buckets[action] = (tokens - 1, now)
            return True
        self._buckets[action] = (tokens, now)
        return False

    def _count_ice(self) -> None:
        with self._lock:
            self.counters.insufficient_capacity += 1


# --- wiring into moto -------------------------------------------------------------------------

_install_lock = threading.Lock()
_installed: list[Ec2Faults] = []  # a stack: the last installed set is the active one
_originals: dict[str, Any] = {}


def active() -> Ec2Faults | None:
    return _installed[-1] if _installed else None


def install(faults: Ec2Faults) -> Ec2Faults:
    """Make `faults` the process's active fault set, wrapping moto's handlers on first use.

    Installs nest: `uninstall(faults)` makes the previously installed set active again, and moto's
    own handlers come back when the last one is uninstalled.
    """
    with _install_lock:
        if not _originals:
            _patch_moto()
        _installed.append(faults)
    return faults


def uninstall(faults: Ec2Faults | None = None) -> None:
    """Remove `faults` (default: the active set); restore moto's handlers when none is left."""
    with _install_lock:
        target = faults if faults is not None else (_installed[-1] if _installed else None)
        for index in range(len(_installed) - 1, -1, -1):
            if _installed[index] is target:
                del _installed[index]
                break
        if _installed or not _originals:
            return
        from moto.core.responses import BaseResponse
        from moto.ec2.responses.fleets import Fleets
        from moto.ec2.responses.instances import InstanceResponse

        InstanceResponse.run_instances = _originals.pop("run_instances")
        Fleets.create_fleet = _originals.pop("create_fleet")
        BaseResponse.call_action = _originals.pop("call_action")


def _ice_message(instance_type: str, zone: str | None, capacity_type: str) -> str:
    if capacity_type == CAPACITY_SPOT:
        return f"There is no Spot capacity available that matches your request ({instance_type} in {zone})."
    return (
        f"We currently do not have sufficient {instance_type} capacity in the Availability Zone you "
        f"requested ({zone}). Our system will be working on provisioning additional capacity."
    )


def _subnet_zone(backend: Any, subnet_id: str | None) -> str | None:
    if not subnet_id:
        return None
    try:
        return backend.get_subnet(subnet_id).availability_zone
    except Exception:  # an unknown subnet is moto's error to report, not ours
        return None


def _template_data(backend: Any, spec: Mapping[str, Any] | None) -> dict[str, Any]:
    if not spec:
        return {}
    try:
        return dict(backend._get_template_from_args(dict(spec)).data)
    except Exception:
        return {}


def _template_subnet(data: Mapping[str, Any]) -> str | None:
    for nic in data.get("NetworkInterfaces") or ():
        if nic.get("SubnetId"):
            return nic["SubnetId"]
    return None


def _launch_zone(backend: Any, zone: str | None, subnet_id: str | None, template: Mapping[str, Any]) -> str:
    """The zone an instance lands in, as moto decides: the request's own zone, else its subnet's,
    else the launch template's subnet's or zone, else the region's first."""
    return (
        zone
        or _subnet_zone(backend, subnet_id)
        or _subnet_zone(backend, _template_subnet(template))
        or (template.get("Placement") or {}).get("AvailabilityZone")
        or f"{backend.region_name}a"
    )


def _run_instances_pool(response: Any) -> tuple[str, str | None, str]:
    """(instance type, zone, capacity type) of a RunInstances request, resolved as moto will."""
    backend = response.ec2_backend
    template = _template_data(backend, response._get_param("LaunchTemplate", {}))
    instance_type = response._get_param("InstanceType") or template.get("InstanceType") or "m1.small"
    zone = _launch_zone(
        backend, response._get_param("Placement.AvailabilityZone"), response._get_param("SubnetId"), template
    )
    market = response._get_param("InstanceMarketOptions.MarketType") or (
        template.get("InstanceMarketOptions") or {}
    ).get("MarketType")
    return instance_type, zone, CAPACITY_SPOT if market == CAPACITY_SPOT else CAPACITY_ON_DEMAND


def _patched_run_instances(self: Any) -> Any:
    faults = active()
    if faults is not None:
        instance_type, zone, capacity_type = _run_instances_pool(self)
        if faults.exhausted(instance_type, zone, capacity_type):
            from moto.ec2.exceptions import EC2ClientError

            faults._count_ice()
            raise EC2ClientError(ICE_CODE, _ice_message(instance_type, zone, capacity_type))
    return _originals["run_instances"](self)


def _fleet_capacity_type(target: Mapping[str, Any]) -> str:
    default = target.get("DefaultTargetCapacityType") or CAPACITY_ON_DEMAND
    return CAPACITY_SPOT if default == CAPACITY_SPOT else CAPACITY_ON_DEMAND


def _split_fleet_configs(
    response: Any, faults: Ec2Faults, configs: list[dict[str, Any]], capacity_type: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The launch template configs with exhausted overrides removed, and the Errors[] for them."""
    backend = response.ec2_backend
    kept: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    for config in configs:
        spec = config.get("LaunchTemplateSpecification") or {}
        data = _template_data(backend, spec)
        overrides = config.get("Overrides") or [{}]
        survivors = []
        for override in overrides:
            instance_type = override.get("InstanceType") or data.get("InstanceType") or ""
            zone = _launch_zone(backend, override.get("AvailabilityZone"), override.get("SubnetId"), data)
            if faults.exhausted(instance_type, zone, capacity_type):
                faults._count_ice()
                ref = {k: v for k, v in spec.items() if k in _TEMPLATE_REF_KEYS}
                errors.append(
                    {
                        "LaunchTemplateAndOverrides": {
                            "LaunchTemplateSpecification": ref,
                            "Overrides": dict(override),
                        },
                        "Lifecycle": capacity_type,
                        "ErrorCode": ICE_CODE,
                        "ErrorMessage": _ice_message(instance_type, zone, capacity_type),
                    }
                )
            else:
                survivors.append(override)
        if survivors:
            kept.append({**config, "Overrides": survivors} if config.get("Overrides") else config)
    return kept, errors


def _patched_create_fleet(self: Any) -> Any:
    faults = active()
    original = _originals["create_fleet"]
    if faults is None or not faults.spec().insufficient_capacity:
        return original(self)
    configs = self._get_param("LaunchTemplateConfigs", [])
    target = dict(self._get_param("TargetCapacitySpecification", {}))
    kept, errors = _split_fleet_configs(self, faults, configs, _fleet_capacity_type(target))
    if not errors:
        return original(self)
    # moto reads its parameters through _get_param; hand it the filtered request.
    overridden: dict[str, Any] = {"LaunchTemplateConfigs": kept}
    if not kept:
        # Nothing left to launch: an empty fleet (moto cannot pick from zero launch specs).
        overridden["TargetCapacitySpecification"] = {
            **target,
            "TotalTargetCapacity": 0,
            "OnDemandTargetCapacity": 0,
            "SpotTargetCapacity": 0,
        }
    real_get_param = self._get_param

    def get_param(name: str, if_none: Any = None) -> Any:
        return overridden[name] if name in overridden else real_get_param(name, if_none)

    self._get_param = get_param
    try:
        result = original(self)
    finally:
        del self._get_param
    payload = result.result
    payload.setdefault("Instances", [])
    payload["Errors"] = errors
    return result


def _patched_call_action(self: Any) -> Any:
    faults = active()
    original = _originals["call_action"]
    if faults is None or getattr(self, "service_name", None) != "ec2":
        return original(self)
    if (self.headers or {}).get(SIM_CLIENT_HEADER) == SIM_CLIENT_VALUE:
        return original(self)
    action = self._get_action()
    if not faults.should_throttle(action):
        return original(self)
    from moto.core.responses import ActionResult
    from moto.ec2.exceptions import EC2ClientError

    error = EC2ClientError(THROTTLE_CODE, "Request limit exceeded.")
    _, headers, body = self.serialized(ActionResult(error))
    headers["status"] = "503"
    return 503, headers, body


def _patch_moto() -> None:
    from moto.core.responses import BaseResponse
    from moto.ec2.responses.fleets import Fleets
    from moto.ec2.responses.instances import InstanceResponse

    _originals["run_instances"] = InstanceResponse.run_instances
    _originals["create_fleet"] = Fleets.create_fleet
    _originals["call_action"] = BaseResponse.call_action
    InstanceResponse.run_instances = _patched_run_instances
    Fleets.create_fleet = _patched_create_fleet
    BaseResponse.call_action = _patched_call_action


def mark_sim_client(client: Any) -> Any:
    """Tag a boto3 EC2 client as the simulator's own, so injected throttling leaves it alone."""

    def add_header(request: Any, **_: Any) -> None:
        request.headers[SIM_CLIENT_HEADER] = SIM_CLIENT_VALUE

    client.meta.events.register_first("before-sign.ec2.*", add_header)
    return client
