"""Resource vectors (cpu, memory, pods, ephemeral storage, extended resources) as plain integers.

The planner adds and compares requests millions of times on a large cluster, so quantities are parsed
once at the boundary (`from_kube`) into integers: cpu in millicores, everything else in whole units
(bytes for memory and storage). Instances are treated as immutable values.
"""

from __future__ import annotations

from collections.abc import Mapping

from api.quantity import format_bytes, format_millicores, millicores, to_int

CPU = "cpu"
MEMORY = "memory"
PODS = "pods"
EPHEMERAL_STORAGE = "ephemeral-storage"

_EMPTY: dict[str, int] = {}


class Resources:
    """An immutable resource vector. `extended` holds anything else (e.g. nvidia.com/gpu)."""

    __slots__ = ("cpu", "ephemeral_storage", "extended", "memory", "pods")

    cpu: int
    memory: int
    pods: int
    ephemeral_storage: int
    extended: dict[str, int]

    def __init__(
        self,
        cpu: int = 0,
        memory: int = 0,
        pods: int = 0,
        ephemeral_storage: int = 0,
        extended: Mapping[str, int] | None = None,
    ) -> None:
        self.cpu = cpu
        self.memory = memory
        self.pods = pods
        self.ephemeral_storage = ephemeral_storage
        # Most vectors have no extended resources: share one empty dict instead of allocating.
        self.extended = dict(extended) if extended else _EMPTY

    def by_name(self) -> dict[str, int]:
        """The vector keyed by Kubernetes resource names, zeros included (cpu in millicores)."""
        return {
            CPU: self.cpu,
            MEMORY: self.memory,
            PODS: self.pods,
            EPHEMERAL_STORAGE: self.ephemeral_storage,
            **self.extended,
        }

    @classmethod
    def from_kube(cls, values: Mapping[str, str | int | float] | None) -> Resources:
        """Parse a Kubernetes resource list such as {"cpu": "250m", "memory": "1Gi"}."""
        if not values:
            return ZERO
        cpu = memory = pods = storage = 0
        extended: dict[str, int] = {}
        for name, value in values.items():
            if name == CPU:
                cpu = millicores(value)
            elif name == MEMORY:
                memory = to_int(value)
            elif name == PODS:
                pods = to_int(value)
            elif name == EPHEMERAL_STORAGE:
                storage = to_int(value)
            else:
                extended[name] = to_int(value)
        return cls(cpu, memory, pods, storage, extended)

    def __add__(self, other: Resources) -> Resources:
        extended = self.extended
        if other.extended:
            extended = dict(self.extended)
            for name, value in other.extended.items():
                extended[name] = extended.get(name, 0) + value
        return Resources(
            self.cpu + other.cpu,
            self.memory + other.memory,
            self.pods + other.pods,
            self.ephemeral_storage + other.ephemeral_storage,
            extended,
        )

    def __sub__(self, other: Resources) -> Resources:
        extended = self.extended
        if other.extended:
            extended = dict(self.extended)
            for name, value in other.extended.items():
                extended[name] = extended.get(name, 0) - value
        return Resources(
            self.cpu - other.cpu,
            self.memory - other.memory,
            self.pods - other.pods,
            self.ephemeral_storage - other.ephemeral_storage,
            extended,
        )

    def max(self, other: Resources) -> Resources:
        """Element-wise maximum (the init-container rule)."""
        extended = dict(self.extended)
        for name, value in other.extended.items():
            extended[name] = max(extended.get(name, 0), value)
        return Resources(
            max(self.cpu, other.cpu),
            max(self.memory, other.memory),
            max(self.pods, other.pods),
            max(self.ephemeral_storage, other.ephemeral_storage),
            extended,
        )

    def fits(self, available: Resources) -> bool:
        """True when every component of self is <= the same component of `available`."""
        if (
            self.cpu > available.cpu
            or self.memory > available.memory
            or self.pods > available.pods
            or self.ephemeral_storage > available.ephemeral_storage
        ):
            return False
        return all(value <= available.extended.get(name, 0) for name, value in self.extended.items())

    def _key(self) -> tuple[int, int, int, int, tuple[tuple[str, int], ...]]:
        return (
            self.cpu,
            self.memory,
            self.pods,
            self.ephemeral_storage,
            tuple(sorted((k, v) for k, v in self.extended.items() if v)),
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Resources) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        parts = [f"cpu={format_millicores(self.cpu)}", f"memory={format_bytes(self.memory)}"]
        if self.pods:
            parts.append(f"pods={self.pods}")
        if self.ephemeral_storage:
            parts.append(f"ephemeral-storage={format_bytes(self.ephemeral_storage)}")
        parts.extend(f"{k}={v}" for k, v in sorted(self.extended.items()))
        return f"Resources({', '.join(parts)})"


ZERO = Resources()
