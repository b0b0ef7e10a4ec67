"""Exceptions: every failed call raises one, carrying what the service said."""

from __future__ import annotations

from typing import Any

# Globus-style codes for the statuses the tern API answers with. The API's body is
# {"error": "one line"}; a "code" field in it, if the service ever sends one, wins.
_CODES: dict[int, str] = {
    400: "BadRequest",
    401: "AuthenticationFailed",
    403: "PermissionDenied",
    404: "ClientError.NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    413: "RequestTooLarge",
    415: "UnsupportedMediaType",
    422: "UnprocessableEntity",
    500: "ServerError",
    503: "ServiceUnavailable",
    507: "InsufficientStorage",
}


class TernError(Exception):
    """Base class of everything this package raises about the service."""


class NetworkError(TernError):
    """No answer came: connection refused, TLS failure (e.g. an untrusted certificate), timeout.

    ``http_status`` is 0, as the tern CLI reports it.
    """

    http_status = 0

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.cause = cause


class TransferAPIError(TernError):
    """The service answered with an error status.

    Attributes:
        http_status: the HTTP status (401 bad token, 403 scope or path prefix, 404 unknown
            job, 409 wrong state, 400/422 invalid request, 503/507 database busy/full).
        code: a stable name for the kind of error (``AuthenticationFailed``,
            ``PermissionDenied``, ``ClientError.NotFound``, ``Conflict``, ...): decide on this.
        message: the service's one-line explanation, with what to do: show this to people.
        body: the decoded answer (usually ``{"error": message}``).
    """

    def __init__(self, http_status: int, code: str, message: str, body: Any = None) -> None:
        super().__init__(f"{message} (HTTP {http_status}, {code})")
        self.http_status = http_status
        self.code = code
        self.message = message
        self.body = body

    @classmethod
    def from_response(cls, http_status: int, body: Any) -> TransferAPIError:
        message = body.get("error") if isinstance(body, dict) else None
        code = body.get("code") if isinstance(body, dict) else None
        if not isinstance(message, str):
            message = body if isinstance(body, str) and body else f"HTTP {http_status}"
        if not isinstance(code, str):
            code = _CODES.get(http_status, "ServerError" if http_status >= 500 else "ClientError")
        return cls(http_status, code, message, body)
