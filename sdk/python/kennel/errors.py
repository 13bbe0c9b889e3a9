"""Errors raised by the Kennel SDK."""

from __future__ import annotations

from typing import Optional


class KennelError(Exception):
    """An error answer from the server: ``{"error": {"code", "message"}}``.

    ``status`` is the HTTP status (``None`` for an ``error`` event that ended a stream after the
    200 response had started); ``code`` the server's error code (``bad_request``,
    ``not_found``, ``busy``, ``unauthorized``, ...); ``message`` its message, verbatim.
    """

    def __init__(self, status: Optional[int], code: str, message: str):
        super().__init__(f"{code}: {message}" if status is None else f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class BadRequest(KennelError):
    """400: the server refused the request (it names the field)."""


class Unauthorized(KennelError):
    """401: no valid bearer token."""


class Forbidden(KennelError):
    """403: something this token may not use (an image the server does not list for it)."""


class NotFound(KennelError):
    """404: no such session, file, image or route."""


class Conflict(KennelError):
    """409: a session name this token's open session has, or (``get_or_create``) one whose
    spec differs; the message names the name or the fields."""


class Busy(KennelError):
    """429: too many runs or sessions at once; retry after ``retry_after`` seconds."""

    def __init__(self, status: Optional[int], code: str, message: str,
                 retry_after: Optional[float] = None):
        super().__init__(status, code, message)
        self.retry_after = retry_after


class SessionEnded(KennelError):
    """410: the session's sandbox has ended."""


class TransportError(KennelError):
    """No answer from the server: the connection could not be made, broke, or timed out.

    ``status`` is ``None``; ``url`` is the server the client was talking to. The httpx error
    underneath is the exception's ``__cause__``.
    """

    def __init__(self, url: str, code: str, message: str):
        super().__init__(None, code, message)
        self.url = url


class ConnectionFailed(TransportError):
    """The server could not be reached: nothing listens at ``url`` (connection refused), the
    name does not resolve, or the connection could not be made in time."""


class ConnectionLost(TransportError):
    """The connection broke before the server's answer was complete (the server stopped)."""


class RequestTimeout(TransportError):
    """No answer within the client's ``timeout`` (it should exceed the runs' own limits)."""


_BY_STATUS = {400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound,
              409: Conflict, 410: SessionEnded}


def error_for(status: Optional[int], code: str, message: str,
              retry_after: Optional[float] = None) -> KennelError:
    """The most specific error class for an answer."""
    if status == 429:
        return Busy(status, code, message, retry_after)
    return _BY_STATUS.get(status or 0, KennelError)(status, code, message)
