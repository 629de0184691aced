"""Keep the informer cache's heap out of the garbage collector's way.

At 100,000 pods the cache holds millions of container objects (the objects as listed, and their
parsed forms) that live as long as the worker. CPython's cyclic collector walks every one of them in
each full collection, and a pass allocates enough to start one or two: measured with
bench/bench_controller.py, a third of a pass's CPU went to the collector before this.

`gc.freeze()` moves every object alive at that moment to a permanent generation that collections
skip. Done once the cache has listed everything, after a full collection (so garbage is not frozen).
Frozen objects are still freed by reference counting when the cache drops them; only cyclic garbage
among them would stay, so the heap is collected in full and frozen again every `refreeze_every`
seconds (one full walk every few minutes, instead of one or more per pass), and when it has grown by
half since the last freeze (a cluster that doubles its pods).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

log = logging.getLogger(__name__)

REFREEZE_EVERY = 600.0  # seconds
CHECK_EVERY = 30.0  # seconds between looks at how much the unfrozen heap has grown


class HeapFreezer:
    def __init__(self, refreeze_every: float = REFREEZE_EVERY, check_every: float = CHECK_EVERY) -> None:
        self.refreeze_every = refreeze_every
        self.check_every = check_every
        self.freezes = 0
        self.frozen = 0  # objects in the permanent generation after the last freeze
        self.last_seconds = 0.0  # how long the last collect-and-freeze took

    def freeze(self) -> None:
        """Collect everything (frozen objects too), then freeze what survives."""
        began = time.perf_counter()
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self.frozen = gc.get_freeze_count()
        self.freezes += 1
        self.last_seconds = time.perf_counter() - began
        log.debug("heap frozen: %d objects in %.2fs", self.frozen, self.last_seconds)

    def grown(self) -> bool:
        """Whether the collector's generations hold more than half as much again as was frozen."""
        return len(gc.get_objects(generation=2)) > max(self.frozen // 2, 100_000)

    async def run(self) -> None:
        """Freeze now, then again whenever it is due. Runs on the event loop: a freeze blocks it for as
        long as a full collection takes (about a second at 200,000 pods), every few minutes."""
        self.freeze()
        frozen_at = time.monotonic()
        while True:
            await asyncio.sleep(self.check_every)
            if time.monotonic() - frozen_at >= self.refreeze_every or self.grown():
                self.freeze()
                frozen_at = time.monotonic()
