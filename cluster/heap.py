"""Keep the informer cache's heap out of the garbage collector's way.

At 100,000 pods the cache holds millions of container objects (the objects as listed, and their
parsed forms) that live as long as the worker. CPython's cyclic collector walks every one of them in
each full collection, and a pass allocates enough to start one or two: measured with
bench/bench_controller.py, a third of a pass's CPU went to the collector before this.

`gc.freeze()` moves every object alive at that moment to a permanent generation that collections
skip. Done once the cache has listed everything, parsed it for the planner and planned a first pass
(the pass cache is long-lived too), after a full collection (so garbage is not frozen); until then
the collector is paused (`paused`): it would walk the freshly synced heap over and over. Frozen
objects are still freed by reference counting when the cache drops them; only cyclic garbage among
them would stay, so the heap is collected in full and frozen again every `refreeze_every` seconds
(one full walk every few minutes, instead of one or more per pass), and sooner when the cache has
taken in many new objects (a re-list, a growing cluster).

The thresholds are raised too (THRESHOLDS): a pass allocates millions of objects that live until
it ends, and with CPython's defaults (700, 10, 10) they are walked hundreds of times, in two or three
full collections per pass (0.4-0.8 s of a 2.5 s pass at 78,000 pods); with these, a handful of young
collections. Reference counting frees almost everything anyway: the collector is only for cycles.
As each pass begins (`before_pass`, from the cache's `snapshot`), the young generations are swept
while they are small, so their periodic collection does not fall in the middle of a pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Callable, Iterator

log = logging.getLogger(__name__)

REFREEZE_EVERY = 600.0  # seconds
CHECK_EVERY = 2.0  # seconds between looks at how much the long-lived heap has grown
GROWTH = 0.25  # of the objects frozen last time: new long-lived ones that call for a freeze
THRESHOLDS = (50_000, 20, 100)  # gc.set_threshold: allocations before a young collection, and so on


class HeapFreezer:
    def __init__(
        self,
        refreeze_every: float = REFREEZE_EVERY,
        check_every: float = CHECK_EVERY,
        thresholds: tuple[int, int, int] | None = THRESHOLDS,
    ) -> None:
        self.refreeze_every = refreeze_every
        self.thresholds = thresholds
        self.check_every = check_every
        self.freezes = 0
        self.frozen = 0  # objects in the permanent generation after the last freeze
        self.last_seconds = 0.0  # how long the last collect-and-freeze took

    def freeze(self) -> None:
        """Collect everything (frozen objects too), then freeze what survives."""
        began = time.perf_counter()
        if self.thresholds is not None:
            gc.set_threshold(*self.thresholds)
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self.frozen = gc.get_freeze_count()
        self.freezes += 1
        self.last_seconds = time.perf_counter() - began
        log.debug("heap frozen: %d objects in %.2fs", self.frozen, self.last_seconds)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No collection while a bounded burst of long-lived objects is made: the cache's first parse
        of what it synced and the first pass (2.1 s of collections walking the unfrozen heap during
        a 5 s parse at 78,000 pods, bench/bench_controller.py). The freeze that follows collects
        once. Only around work that ends: a collector left off would let cyclic garbage pile up."""
        if self.thresholds is None or not gc.isenabled():  # a test's freezer leaves gc alone
            yield
            return
        gc.disable()
        try:
            yield
        finally:
            gc.enable()

    def before_pass(self) -> None:
        """Sweep the young generations as a pass begins, while they hold little: the last pass's
        objects are gone by now. Left to the thresholds, a generation-1 collection falls in the
        middle of every fourth or fifth pass, when the pass's own millions of objects are alive, and
        walks them all (0.5-0.9 s at 78,000 pods, bench/bench_controller.py); this one walks what
        outlived the last pass and came in since (under 0.1 s there), and resets the count."""
        # The worker's policy (a test's freezer leaves gc alone); none while paused (the first pass).
        if self.thresholds is not None and gc.isenabled():
            gc.collect(1)

    async def keep_frozen(self, received: Callable[[], int], held: Callable[[], int]) -> None:
        """After a first `freeze()`: freeze again every `refreeze_every` seconds, or sooner when the
        cache has taken in (`received`: objects listed, watched or parsed so far) a quarter as many
        objects as it holds (`held`) since the last freeze: a re-list, or the cluster grown. Runs on
        the event loop: a freeze blocks it for as long as a full collection takes (about a second at
        200,000 pods)."""
        frozen_at, taken = time.monotonic(), received()
        while True:
            await asyncio.sleep(self.check_every)
            due = time.monotonic() - frozen_at >= self.refreeze_every
            if due or received() - taken > max(GROWTH * held(), 1000):
                self.freeze()
                frozen_at, taken = time.monotonic(), received()
