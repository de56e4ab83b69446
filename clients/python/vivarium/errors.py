"""Exceptions raised by the client, one per kind of error the server reports.

The server answers errors as ``{"error": {"code": "...", "message": "..."}}``
with an HTTP status; :func:`from_response` maps them here. Outcomes of the
code itself (an exception, a timeout) are not exceptions of the client: they
are in :class:`vivarium.Execution` (``status``, ``error``).
"""


class VivariumError(Exception):
    """Base class of every error of this package.

    ``status`` is the HTTP status (0 when the server could not be reached),
    ``code`` the server's error code, ``message`` its explanation.
    """

    def __init__(self, message, status=0, code=""):
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code

    def __str__(self):
        if self.status:
            return "%s (HTTP %d %s)" % (self.message, self.status, self.code)
        return self.message


class ConnectionFailed(VivariumError):
    """The server could not be reached."""


class InvalidRequestError(VivariumError):
    """400: the request was malformed or asked for something impossible."""


class AuthenticationError(VivariumError):
    """401: no API key, or one the server does not know."""


class NotAllowedError(VivariumError):
    """403: the server's policy does not allow it (a host outside its network
    allowlist, a package not on its list)."""


class NotFoundError(VivariumError):
    """404: no such sandbox (or it belongs to another key), or no such file."""


class SandboxBusyError(VivariumError):
    """409: the sandbox is running another execution."""


class SandboxPausedError(SandboxBusyError):
    """409: the sandbox is paused (Sandbox.pause); resume it first. Also
    raised by pause() on a paused sandbox, and, as "not_paused", by
    resume() on one that is not."""


class SandboxClosedError(VivariumError):
    """410: the sandbox was closed."""


class TooLargeError(VivariumError):
    """413: a file or request is over the limit."""


class QuotaExceededError(VivariumError):
    """429: too many sandboxes or executions at once for this key or server."""


class ServerUnavailableError(VivariumError):
    """503 (and 501, 507): the server is shutting down, cannot create
    sandboxes or do what was asked here, or has no room left (507: the disk
    paused sandboxes go to)."""


class ServerError(VivariumError):
    """500 and anything unexpected."""


class VolumeInUseError(VivariumError):
    """409: a live sandbox mounts the volume; close it first."""


_BY_CODE = {
    "invalid_request": InvalidRequestError,
    "unauthorized": AuthenticationError,
    "not_allowed": NotAllowedError,
    "not_found": NotFoundError,
    "file_not_found": NotFoundError,
    "busy": SandboxBusyError,
    "paused": SandboxPausedError,
    "not_paused": SandboxPausedError,
    "in_use": VolumeInUseError,
    "closed": SandboxClosedError,
    "too_large": TooLargeError,
    "quota": QuotaExceededError,
    "shutting_down": ServerUnavailableError,
    "setup_failed": ServerUnavailableError,
    "unsupported": ServerUnavailableError,
    "no_room": ServerUnavailableError,
}

_BY_STATUS = {
    400: InvalidRequestError,
    401: AuthenticationError,
    403: NotAllowedError,
    404: NotFoundError,
    409: SandboxBusyError,
    410: SandboxClosedError,
    413: TooLargeError,
    429: QuotaExceededError,
    501: ServerUnavailableError,
    507: ServerUnavailableError,
    503: ServerUnavailableError,
}


def from_response(status, body):
    """The exception for an error answer: status and the decoded body."""
    code, message = "", ""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        code = str(body["error"].get("code", ""))
        message = str(body["error"].get("message", ""))
    if not message:
        message = "the server answered HTTP %d" % status
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status, ServerError)
    return cls(message, status, code)
