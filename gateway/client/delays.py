"""The `delay` and `at` of a delayed update, from Python values to the wire's parameters.

Why the client checks them itself, with the broker's own rules (:mod:`broker.core.due`): a bad
value must be refused before anything is sent, over both transports alike, with the error the
broker would have given (``invalid_request``, 400). An update the application meant to delay must
never reach the broker without its delay, where it would run at once.

Accepted: `delay` as milliseconds (a non-negative int), a non-negative :class:`~datetime.timedelta`
or an ISO 8601 duration string (``PT30S``); `at` as a timezone-aware :class:`~datetime.datetime`
or an RFC 3339 string with its offset. Not both.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from broker.api import SepaError, due_micros, now_micros, parse_at, parse_delay, rfc3339
from gateway.client.errors import SepaClientError

Delay = int | timedelta | str
Instant = datetime | str

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _refused(description: str) -> SepaClientError:
    return SepaClientError("invalid_request", description, 400)


def delay_param(delay: Delay) -> str:
    """The `delay` parameter: whole milliseconds as digits, anything finer as an ISO 8601 duration."""
    if isinstance(delay, bool) or not isinstance(delay, int | timedelta | str):
        raise _refused(
            f"delay must be milliseconds (int), a timedelta or an ISO 8601 duration string, not {type(delay).__name__}"
        )
    if isinstance(delay, int):
        if delay < 0:
            raise _refused(f"delay must not be negative, got {delay} ms")
        return str(delay)
    if isinstance(delay, timedelta):
        if delay < timedelta(0):
            raise _refused(f"delay must not be negative, got {delay}")
        micros = delay // _MICROSECOND
        if micros % 1000 == 0:
            return str(micros // 1000)
        return f"PT{micros // 1_000_000}.{micros % 1_000_000:06d}S"
    _check(parse_delay, delay)
    return delay.strip()


def at_param(at: Instant) -> str:
    """The `at` parameter: an aware datetime in RFC 3339 UTC, or a checked RFC 3339 string."""
    if isinstance(at, datetime):
        if at.tzinfo is None or at.utcoffset() is None:
            raise _refused("at must be a timezone-aware datetime (a naive one names no instant)")
        return rfc3339((at - _EPOCH) // _MICROSECOND)
    if not isinstance(at, str):
        raise _refused(f"at must be a timezone-aware datetime or an RFC 3339 string, not {type(at).__name__}")
    _check(parse_at, at)
    return at.strip()


def due_params(delay: Delay | None, at: Instant | None) -> tuple[str | None, str | None]:
    """The wire's (`delay`, `at`) of a delayed update, checked as the broker will check them."""
    if delay is None and at is None:
        raise _refused("a delayed update needs a delay or an at")
    delay_text = None if delay is None else delay_param(delay)
    at_text = None if at is None else at_param(at)
    try:
        due_micros(delay_text, at_text, now_micros())  # both given, more than ten years away
    except SepaError as error:
        raise SepaClientError.from_engine(error) from None
    return delay_text, at_text


def _check(parse: Callable[[str], int], text: str) -> None:
    try:
        parse(text)
    except SepaError as error:
        raise SepaClientError.from_engine(error) from None
