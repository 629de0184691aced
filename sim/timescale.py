"""One factor scales every simulated delay, so tests run in milliseconds and demos look real.

A delay written as `scale.seconds(30)` is 30 s at factor 1.0, 0.3 s at 0.01 and immediate at 0.
Only the simulator's own delays are scaled (node registration, readiness, pod start, grace
periods); karpflow's workflows keep real time.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass
class TimeScale:
    factor: float = 1.0

    def __post_init__(self) -> None:
        if self.factor < 0:
            raise ValueError(f"time scale must be >= 0, got {self.factor}")

    def seconds(self, base: float) -> float:
        return max(0.0, base * self.factor)

    async def sleep(self, base: float) -> None:
        delay = self.seconds(base)
        # sleep(0) still yields, so a zero factor cannot starve the event loop.
        await asyncio.sleep(delay)
