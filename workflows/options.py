"""Activity options shared by the workflows, named so that each call site says which one it uses.

Imported inside `workflow.unsafe.imports_passed_through()`: plain values, no side effects.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy

from activities.errors import NON_RETRYABLE_TYPES

# Short API calls: retried with backoff while the error is retryable, but never for ever: an
# unexpected exception (a bug) fails the call after API_ATTEMPTS (about 80 s), with its cause kept,
# so a disruption rolls back instead of staying stuck with its candidates tainted.
API_CALL = timedelta(seconds=60)
API_ATTEMPTS = 10
API_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=API_ATTEMPTS,
    non_retryable_error_types=list(NON_RETRYABLE_TYPES),
)
# Waits (for a replacement to register or initialize) retry like API calls, but are bounded by the
# caller's deadline (schedule_to_close), not by attempts: a wait polls the API for minutes, and
# API_ATTEMPTS passing errors (a 500 on a GET, a dead worker's heartbeat timeout) would otherwise end
# it long before its deadline (chaos seed 4242: an interruption's replacement given up that way).
WAIT_RETRY = RetryPolicy(
    initial_interval=API_RETRY.initial_interval,
    maximum_interval=API_RETRY.maximum_interval,
    non_retryable_error_types=list(NON_RETRYABLE_TYPES),
)
# A drain attempt is long and heartbeats; a retry resumes from the cluster's state, so back off further.
# Unbounded on purpose: a drain blocked by PDBs waits as Karpenter's does, until the node's
# terminationGracePeriod deadline (a timer in the drain) forces it.
DRAIN_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    non_retryable_error_types=list(NON_RETRYABLE_TYPES),
)
# Terminating an instance heartbeats while it waits for EC2 to report the instance gone.
INSTANCE_TERMINATE_HEARTBEAT = timedelta(minutes=1)
# A look taken while something else is waited for (a waiting command judged again): a few attempts,
# then the wait goes on and looks again later.
CHECK_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=3,
    non_retryable_error_types=list(NON_RETRYABLE_TYPES),
)
# A rollback's terminate of a replacement instance (a termination's own comes with its input).
INSTANCE_TERMINATE = timedelta(minutes=10)

# The controller's pass: planning heartbeats (activities/planning.py), so a pass lost with its worker is
# retried within PASS_HEARTBEAT; a failed pass is recorded and the next one runs.
PASS_TIMEOUT = timedelta(minutes=5)
PASS_HEARTBEAT = timedelta(seconds=30)
PASS_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
    non_retryable_error_types=list(NON_RETRYABLE_TYPES),
)
# A garbage collection waits on EC2 for each instance it terminates (ten at a time); it heartbeats.
GARBAGE_COLLECTION_TIMEOUT = timedelta(minutes=10)
# The pass's own short steps (crash cleanup, annotations, finalizers, controls, leaving taints).
PASS_STEP = timedelta(seconds=30)

# A look again at a replacement that initialized (is it still there?): short, a few attempts; a node
# that is there but not Ready just now is not waited for.
LOOK_AGAIN_CALL = timedelta(seconds=20)
LOOK_AGAIN_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=5),
    maximum_attempts=3,
    non_retryable_error_types=list(NON_RETRYABLE_TYPES),
)
