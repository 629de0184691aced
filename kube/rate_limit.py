"""The Kubernetes client's own manners: a token bucket in front of every request, and the server's
`Retry-After` honoured on 429 (API Priority and Fairness) and on a 5xx that carries one.

client-go throttles every request of a rest.Config through `flowcontrol.NewTokenBucketRateLimiter(QPS,
Burst)` (a `golang.org/x/time/rate` limiter: `burst` tokens, one back every 1/qps seconds, a request
waits for its token), watches included; Karpenter sets QPS 200 and burst 300
(kubernetes-sigs/karpenter pkg/operator/options/options.go `--kube-client-qps`, `--kube-client-burst`).
client-go's request retries a response that is 429, or 5xx with a `Retry-After` header, after the
seconds the header says, up to 10 times (k8s.io/client-go rest/request.go `checkWait`, `maxRetries`).
karpflow does the same for the same responses, with each wait capped and all of them within the
request's own timeout (kube/client.py): a server asking for minutes would hold an activity past its
timeout; the activity's retry policy takes over then.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping

from runtime import metrics

DEFAULT_QPS = 200.0  # Karpenter's --kube-client-qps
DEFAULT_BURST = 300  # Karpenter's --kube-client-burst
MAX_RETRIES = 10  # client-go's rest.Request maxRetries
MAX_RETRY_AFTER = 30.0  # seconds: the longest wait one Retry-After may impose here


class TokenBucket:
    """`burst` tokens, refilled at `qps` a second; `acquire` waits for one. Reservations as
    x/time/rate's: a caller that finds none takes a future token and sleeps until it is due, so
    waiting callers are served in order and the long-run rate is `qps` however many wait."""

    def __init__(
        self,
        qps: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if qps <= 0:
            raise ValueError(f"qps must be positive, got {qps}")
        self.qps = float(qps)
        self.burst = max(1, int(burst))
        self._clock = clock
        self._sleep = sleep
        self._tokens = float(self.burst)
        self._at = clock()
        self.waited = 0.0  # seconds callers spent waiting for a token, in all (for metrics, tests)

    def reserve(self) -> float:
        """Take a token; the seconds until it is due (0: now)."""
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.qps)
        self._at = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    async def acquire(self) -> None:
        wait = self.reserve()
        if wait > 0:
            self.waited += wait
            metrics.KUBE_CLIENT_THROTTLED.inc(wait)
            await self._sleep(wait)


def retry_after(status: int, headers: Mapping[str, str]) -> float | None:
    """Seconds to wait before sending the request again, or None when the response is not one to
    retry: 429 or 5xx carrying a `Retry-After` in seconds (the form kube-apiserver sends), as
    client-go's `checkWait`. Without the header nothing is retried here (a PDB's 429 on an eviction
    is the drain's to handle)."""
    if status != 429 and status < 500:
        return None
    raw = headers.get("Retry-After")
    if raw is None:
        return None
    try:
        seconds = float(raw.strip())
    except ValueError:
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)
