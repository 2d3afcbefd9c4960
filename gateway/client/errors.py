"""Errors of the client API: one exception type carrying the protocol's error JSON.

Why one type for both transports: an application must handle a refused request the same way
whether it talks to the broker in-process or over the network, so the engine's exceptions and the
wire's error replies are both turned into :class:`SepaClientError` with the exact members of
PROTOCOL.md (``error``, ``error_description``, ``status_code``). Failures that happen on the
client side of the wire (broker unreachable, socket lost) are :class:`SepaConnectionError`, a
subclass, so code that only cares "did it work" catches one class and code that wants to retry
can tell the two apart.
"""

from __future__ import annotations

from typing import Any

from broker.api import SepaError


class SepaClientError(Exception):
    """A request the broker refused (or that could not reach it): the protocol's error JSON."""

    def __init__(self, error: str, error_description: str, status_code: int, *, alias: str | None = None) -> None:
        super().__init__(f"{error} ({status_code}): {error_description}")
        self.error = error
        self.error_description = error_description
        self.status_code = status_code
        self.alias = alias

    def to_json(self) -> dict[str, Any]:
        """The error as the wire carries it (alias only when it answers a subscribe)."""
        body: dict[str, Any] = {
            "error": self.error,
            "error_description": self.error_description,
            "status_code": self.status_code,
        }
        if self.alias is not None:
            body["alias"] = self.alias
        return body

    @classmethod
    def from_json(cls, body: Any, *, status_code: int | None = None, fallback: str = "") -> SepaClientError:
        """Build from an error reply; tolerates brokers whose error body is not the protocol's JSON."""
        if isinstance(body, dict) and isinstance(body.get("error"), str):
            status = body.get("status_code", status_code)
            return cls(
                body["error"],
                str(body.get("error_description", "")),
                int(status) if isinstance(status, int) else int(status_code or 500),
                alias=body.get("alias") if isinstance(body.get("alias"), str) else None,
            )
        status = status_code or 500
        return cls("http_error" if status != 500 else "internal_error", fallback or str(body), status)

    @classmethod
    def from_engine(cls, error: SepaError, *, alias: str | None = None) -> SepaClientError:
        """The in-process transport's translation of an engine exception (same JSON as the gates)."""
        return cls(error.error, error.description, error.status_code, alias=alias)


class SepaConnectionError(SepaClientError):
    """The broker could not be reached, or the connection was lost before the reply.

    status_code is 503 (service unavailable) so that code inspecting only the status treats it as
    a transient condition; ``error`` is ``"connection_failed"`` (never sent) or
    ``"connection_lost"`` (sent, fate unknown: an update may or may not have been applied).
    """

    def __init__(self, error: str, error_description: str, *, alias: str | None = None) -> None:
        super().__init__(error, error_description, 503, alias=alias)
