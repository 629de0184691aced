"""One log line per expected activity failure, with its cause, instead of a stack trace.

A guard that refuses a node it does not manage, an instance this cluster does not own, an offering
out of capacity, a throttled API call: these are classified by activities/errors.py and expected in
a working cluster. Temporal's worker logs every failed attempt at WARNING with the full traceback,
which buries the one fact an operator needs. This interceptor logs that fact on one line and marks
the error BENIGN, which Temporal logs only at DEBUG (and leaves out of its failure metrics). The
failure the workflow sees is the same: message, type, details, non-retryable flag, retry delay.

Unclassified exceptions (a bug) and SERVER_ERROR (the fallback for an unknown error) keep their
traceback. FORBIDDEN already has its own line (runtime/permission_log.py).
"""

from __future__ import annotations

import logging
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from activities import errors

log = logging.getLogger("karpflow.activities")

EXPECTED_TYPES = frozenset(
    {
        errors.CONFLICT,
        errors.THROTTLED,
        errors.UNAVAILABLE,
        errors.INVALID,
        errors.FORBIDDEN,
        errors.NOT_FOUND,
        errors.NOT_OWNED,
        errors.REFUSED,
        errors.INSUFFICIENT_CAPACITY,
        errors.OFFERING_UNAVAILABLE,
    }
)
LOGGED_ELSEWHERE = frozenset({errors.FORBIDDEN})


class ExpectedFailureLog(Interceptor):
    """Logs each expected failure once per attempt and marks it BENIGN."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next)


class _Inbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        try:
            return await super().execute_activity(input)
        except ApplicationError as err:
            if err.type not in EXPECTED_TYPES or err.category == ApplicationErrorCategory.BENIGN:
                raise
            if err.type not in LOGGED_ELSEWHERE:
                info = activity.info()
                log.log(
                    logging.WARNING if err.non_retryable else logging.INFO,
                    "%s of %s attempt %d %s (%s): %s",
                    info.activity_type,
                    info.workflow_id,
                    info.attempt,
                    "refused" if err.non_retryable else "failed, will retry",
                    err.type,
                    " ".join(err.message.split()),
                )
            raise benign(err) from err.__cause__


def benign(err: ApplicationError) -> ApplicationError:
    """The same failure, marked expected."""
    return ApplicationError(
        err.message,
        *err.details,
        type=err.type,
        non_retryable=err.non_retryable,
        next_retry_delay=err.next_retry_delay,
        category=ApplicationErrorCategory.BENIGN,
    )
