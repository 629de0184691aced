"""Typed API errors. The store raises them; the HTTP layer turns each into a `Status` object.

Messages follow kube-apiserver's wording (`pods "x" not found`, `Operation cannot be fulfilled on
...`) because clients and people grep for them.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error with an HTTP code and a Kubernetes `reason`; `status()` is the wire form."""

    code = 500
    reason = "InternalError"

    def __init__(
        self,
        message: str,
        *,
        name: str | None = None,
        group: str | None = None,
        kind: str | None = None,
        causes: list[dict[str, Any]] | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.name = name
        self.group = group
        self.kind = kind
        self.causes = causes or []
        self.retry_after = retry_after

    def status(self) -> dict[str, Any]:
        details: dict[str, Any] = {}
        if self.name is not None:
            details["name"] = self.name
        if self.group:
            details["group"] = self.group
        if self.kind is not None:
            details["kind"] = self.kind
        if self.causes:
            details["causes"] = self.causes
        if self.retry_after is not None:
            details["retryAfterSeconds"] = self.retry_after
        out: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if details:
            out["details"] = details
        return out


class BadRequest(ApiError):
    code, reason = 400, "BadRequest"


class Unauthorized(ApiError):
    code, reason = 401, "Unauthorized"


class Forbidden(ApiError):
    code, reason = 403, "Forbidden"


class NotFound(ApiError):
    code, reason = 404, "NotFound"


class MethodNotAllowed(ApiError):
    code, reason = 405, "MethodNotAllowed"


class NotAcceptable(ApiError):
    code, reason = 406, "NotAcceptable"


class AlreadyExists(ApiError):
    code, reason = 409, "AlreadyExists"


class Conflict(ApiError):
    code, reason = 409, "Conflict"


class Gone(ApiError):
    """410: a resourceVersion or continue token older than the kept history."""

    code, reason = 410, "Expired"


class UnsupportedMediaType(ApiError):
    code, reason = 415, "UnsupportedMediaType"


class Invalid(ApiError):
    code, reason = 422, "Invalid"


class TooManyRequests(ApiError):
    code, reason = 429, "TooManyRequests"


class InternalError(ApiError):
    code, reason = 500, "InternalError"


class ServiceUnavailable(ApiError):
    code, reason = 503, "ServiceUnavailable"


class Timeout(ApiError):
    code, reason = 504, "Timeout"


_BY_CODE: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    406: NotAcceptable,
    409: Conflict,
    410: Gone,
    415: UnsupportedMediaType,
    422: Invalid,
    429: TooManyRequests,
    500: InternalError,
    503: ServiceUnavailable,
    504: Timeout,
}


def error_for_code(code: int, message: str, **kwargs: Any) -> ApiError:
    """An error of the class kube-apiserver uses for an HTTP code (fault injection uses this)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        err = ApiError(message, **kwargs)
        err.code = code
        return err
    return cls(message, **kwargs)


def invalid(kind: str, name: str, group: str, field_errors: list[tuple[str, str, str]]) -> Invalid:
    """422 in kube-apiserver's shape: one cause per (field, reason type, message)."""
    what = f"{kind}.{group}" if group else kind
    text = "; ".join(f"{f}: {m}" for f, _, m in field_errors)
    return Invalid(
        f'{what} "{name}" is invalid: {text}',
        name=name,
        group=group,
        kind=kind,
        causes=[{"reason": t, "message": m, "field": f} for f, t, m in field_errors],
    )
