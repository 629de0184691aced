"""Delayed actions on the event loop, cancelled together when a controller stops.

Simulated delays (boot, readiness, pod start) are loop timers rather than one task each: a thousand
nodes booting are a thousand heap entries, not a thousand coroutines.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


class Timers:
    def __init__(self) -> None:
        self._handles: set[asyncio.TimerHandle | asyncio.Handle] = set()
        self._stopped = False

    def after(self, delay: float, fn: Callable[[], None], what: str = "") -> None:
        """Run `fn()` on the loop after `delay` real seconds (soon, when <= 0)."""
        if self._stopped:
            return
        loop = asyncio.get_running_loop()
        handle: asyncio.TimerHandle | asyncio.Handle

        def run() -> None:
            self._handles.discard(handle)
            if self._stopped:
                return
            try:
                fn()
            except Exception:
                log.exception("simulated action %s failed", what or fn)

        handle = loop.call_later(delay, run) if delay > 0 else loop.call_soon(run)
        self._handles.add(handle)

    def __len__(self) -> int:
        return len(self._handles)

    def cancel_all(self) -> None:
        self._stopped = True
        for handle in self._handles:
            handle.cancel()
        self._handles.clear()
