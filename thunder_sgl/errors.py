"""One exception hierarchy for thunder_sgl, and the OpenAI-shaped error body.

Every error a client can see maps to an HTTP status and an OpenAI error object
(``{"error": {"message", "type", "code", "param"}}``), so SDK clients surface it as
an ``APIStatusError`` with a readable message instead of a bare 500.
"""

from __future__ import annotations

from typing import Any


class ThunderError(Exception):
    """Base class. ``status`` and ``type`` decide the HTTP answer."""

    status: int = 500
    type: str = "internal_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.param = param
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        return openai_error_body(self.message, self.type, self.code or self.type, self.param)


class ConfigError(ThunderError):
    """A configuration file or option is invalid (raised at start-up)."""

    status = 400
    type = "config_error"


def check_config(ok: bool, message: str) -> None:
    """Raise ``ConfigError(message)`` unless ``ok``: the invariant checks of the config dataclasses."""
    if not ok:
        raise ConfigError(message)


class BadRequest(ThunderError):
    status = 400
    type = "invalid_request_error"


class Unauthorized(ThunderError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class Forbidden(ThunderError):
    status = 403
    type = "permission_error"


class NotFound(ThunderError):
    status = 404
    type = "not_found_error"


class Conflict(ThunderError):
    status = 409
    type = "conflict_error"


class PayloadTooLarge(ThunderError):
    status = 413
    type = "invalid_request_error"
    code = "payload_too_large"


class Overloaded(ThunderError):
    """Bounded queues are full: 503 with Retry-After."""

    status = 503
    type = "overloaded_error"


class UpstreamError(ThunderError):
    """The worker failed or answered with an error we cannot pass through."""

    status = 502
    type = "upstream_error"


class NoBackend(ThunderError):
    status = 503
    type = "no_available_workers"
    code = "no_available_workers"


class GatewayTimeout(ThunderError):
    status = 504
    type = "timeout_error"


class SandboxError(ThunderError):
    status = 500
    type = "sandbox_error"


def openai_error_body(
    message: str, type: str, code: str | int | None = None, param: str | None = None
) -> dict[str, Any]:
    """The body OpenAI clients expect for an error response."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}
