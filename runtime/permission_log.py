"""One clear log line when the cluster or AWS refuses karpflow a permission.

A 403 from Kubernetes (or AccessDenied from EC2) is not retryable: the activity fails and the
workflow rolls back. Temporal logs the failure with a stack trace; an operator fixing a missing
RBAC rule wants one line that says what was refused and to whom. The Kubernetes API server's
message already names the verb, the resource and the ServiceAccount, so this line repeats it with
the file that grants it.
"""

from __future__ import annotations

import logging
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from activities.errors import FORBIDDEN

log = logging.getLogger("karpflow.permissions")
GRANTED_IN = "grant it in deploy/base/rbac.yaml (Kubernetes) or deploy/iam-policy.json (AWS)"


class PermissionDeniedLog(Interceptor):
    """Logs every activity that failed because a permission is missing, once per attempt."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next)


class _Inbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        try:
            return await super().execute_activity(input)
        except ApplicationError as err:
            if err.type == FORBIDDEN:
                log.error(
                    "permission denied in activity %s: %s; %s",
                    activity.info().activity_type,
                    err.message,
                    GRANTED_IN,
                )
            raise
