"""Error classification shared by every activity: retryable or not, with a message naming the object.

Activities raise `ApplicationError` with a `type` from this module. Temporal retries a retryable one
with the retry policy written at the call site; a non-retryable one fails the activity at once and
the workflow decides (try the next offering, compensate, fail with a clear message).
"""

from __future__ import annotations

import asyncio

import aiohttp
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, ParamValidationError
from temporalio.exceptions import ApplicationError as ApplicationError  # re-exported for the activities

from kube.client import KubeError

# Retryable types.
CONFLICT = "Conflict"
THROTTLED = "Throttled"
SERVER_ERROR = "ServerError"
UNAVAILABLE = "Unavailable"
STALE_VIEW = "StaleView"  # the worker's cluster cache has missed changes for too long; it recovers alone
# Not retryable: retrying cannot help, a person or the workflow must act.
INVALID = "InvalidRequest"
FORBIDDEN = "Forbidden"
NOT_FOUND = "NotFound"
NOT_OWNED = "NotOwned"
REFUSED = "Refused"  # a guard at the moment of acting said no (activities/guards.py); nothing changed
INSUFFICIENT_CAPACITY = "InsufficientInstanceCapacity"
OFFERING_UNAVAILABLE = "OfferingUnavailable"  # no subnet in the zone, unsupported type, cached ICE

NON_RETRYABLE_TYPES: tuple[str, ...] = (
    INVALID,
    FORBIDDEN,
    NOT_FOUND,
    NOT_OWNED,
    REFUSED,
    INSUFFICIENT_CAPACITY,
    OFFERING_UNAVAILABLE,
)
# An offering-level failure: the workflow tries the next offering instead of failing.
OFFERING_ERRORS: tuple[str, ...] = (INSUFFICIENT_CAPACITY, OFFERING_UNAVAILABLE)


def retryable(message: str, type: str, *details: object) -> ApplicationError:
    return ApplicationError(message, *details, type=type, non_retryable=False)


def permanent(message: str, type: str, *details: object) -> ApplicationError:
    return ApplicationError(message, *details, type=type, non_retryable=True)


# -- Kubernetes -------------------------------------------------------------------------------------


def not_found(err: BaseException) -> bool:
    """A Kubernetes 404: the object (or, on a list, its API) does not exist."""
    return isinstance(err, KubeError) and err.status == 404


def classify_kube(err: BaseException, what: str) -> ApplicationError:
    """`what` names the object, e.g. "node ip-10-0-1-7" or "eviction of pod default/web-1"."""
    if isinstance(err, ApplicationError):
        return err
    if isinstance(err, KubeError):
        text = f"{what}: Kubernetes API {err.status}: {err.message}"
        if err.status == 404:
            return permanent(text, NOT_FOUND)
        if err.status == 409:
            return retryable(text, CONFLICT)
        if err.status == 429:
            return retryable(text, THROTTLED)
        if err.status in (401, 403):
            return permanent(text, FORBIDDEN)
        if err.status >= 500 or err.status in (408,):
            return retryable(text, SERVER_ERROR)
        return permanent(text, INVALID)
    if isinstance(err, aiohttp.ClientError | asyncio.TimeoutError | ConnectionError | OSError):
        return retryable(f"{what}: Kubernetes API unreachable: {err!r}", UNAVAILABLE)
    return retryable(f"{what}: {err!r}", SERVER_ERROR)


# -- EC2 ----------------------------------------------------------------------------------------------

_EC2_CAPACITY = {
    "InsufficientInstanceCapacity",
    "InsufficientHostCapacity",
    "InsufficientCapacity",
    "InsufficientReservedInstanceCapacity",
    "MaxSpotInstanceCountExceeded",
    "SpotMaxPriceTooLow",
    "UnfulfillableCapacity",
    "Unsupported",
    # Also capacity as far as one offering goes (Karpenter treats them alike): another type, zone or
    # subnet may still launch.
    "InsufficientFreeAddressesInSubnet",
    "VcpuLimitExceeded",
    "ReservationCapacityExceeded",
}
_EC2_THROTTLE = {"RequestLimitExceeded", "Throttling", "ThrottlingException", "TooManyRequestsException"}
_EC2_SERVER = {"InternalError", "ServiceUnavailable", "Unavailable", "InternalFailure"}
_EC2_FORBIDDEN = {"UnauthorizedOperation", "AuthFailure", "AccessDenied", "OptInRequired", "Blocked"}


def ec2_code(err: BaseException) -> str:
    return err.response.get("Error", {}).get("Code", "") if isinstance(err, ClientError) else ""


def classify_ec2(err: BaseException, what: str) -> ApplicationError:
    """`what` names the object, e.g. "instance i-0abc" or "launch of m5.large in us-west-2a"."""
    if isinstance(err, ApplicationError):
        return err
    if isinstance(err, ClientError):
        code = ec2_code(err)
        message = err.response.get("Error", {}).get("Message", "")
        text = f"{what}: EC2 {code}: {message}"
        status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if code in _EC2_CAPACITY:
            return permanent(text, INSUFFICIENT_CAPACITY, code)
        if code in _EC2_THROTTLE:
            return retryable(text, THROTTLED)
        if code == "InvalidParameterValue" and "iaminstanceprofile" in message.lower():
            # A profile created moments ago: IAM is eventually consistent.
            return retryable(text, UNAVAILABLE)
        if code in _EC2_SERVER or status >= 500:
            return retryable(text, SERVER_ERROR)
        if code in _EC2_FORBIDDEN:
            return permanent(text, FORBIDDEN)
        if code.endswith(".NotFound"):
            return permanent(text, NOT_FOUND)
        return permanent(text, INVALID)
    if isinstance(err, ParamValidationError):
        return permanent(f"{what}: invalid EC2 request: {err}", INVALID)
    if isinstance(err, NoCredentialsError):
        return permanent(f"{what}: no AWS credentials: {err}", FORBIDDEN)
    if isinstance(err, BotoCoreError | ConnectionError | OSError):
        return retryable(f"{what}: EC2 unreachable: {err!r}", UNAVAILABLE)
    return retryable(f"{what}: {err!r}", SERVER_ERROR)


def classify_ec2_lookup(err: BaseException, what: str) -> ApplicationError:
    """`classify_ec2` for a look at EC2 taken in passing by a wait: an error that is neither EC2's,
    botocore's nor the network's is a bug (a TypeError, say) and permanent, since asking again
    cannot fix it."""
    if isinstance(err, ApplicationError | ClientError | BotoCoreError | OSError):
        return classify_ec2(err, what)
    return permanent(f"{what}: {err!r}", INVALID)
