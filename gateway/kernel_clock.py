"""The kernel's account of the wall clock: whether NTP (timesyncd, chrony) has it synchronised.

Two users: ``/health``'s ``clock_sync`` component, and the source-time rule of the observations
(``gateway.observations.payloads.not_ahead``), which refuses a sensor's time far ahead of the
gateway's clock only while that clock is known to be right: a Raspberry Pi has no real-time clock,
and one that booted at fake-hwclock's time of its last shutdown, days behind, with no NTP server in
reach, refused every reading a sensor with a clock of its own stamped.
"""

from __future__ import annotations

import ctypes
import time

TIME_ERROR = 5  # adjtimex(2)'s answer while the clock is not synchronised (STA_UNSYNC and others)
TIMEX_BYTES = 512  # more than struct timex takes on any ABI (208 bytes on 64-bit Linux)
ASKED_EVERY_S = 1.0  # a reading's path asks: the kernel's answer is kept this long (~4 us an ask)

_asked = [-ASKED_EVERY_S, None]  # (monotonic time of the last ask, its answer)


def kernel_synchronised() -> bool | None:
    """Whether the kernel says the wall clock is synchronised (adjtimex(2) read-only: modes 0),
    None where it cannot be asked. Only its answer is used, so no field of struct timex, whose
    layout differs between ABIs, is read."""
    try:
        adjtimex = ctypes.CDLL(None).adjtimex  # the C library the process has loaded already
    except (OSError, AttributeError):
        return None
    state = adjtimex(ctypes.create_string_buffer(TIMEX_BYTES))
    return None if state < 0 else state != TIME_ERROR


def synchronised_lately() -> bool | None:
    """:func:`kernel_synchronised`, asked at most once every ASKED_EVERY_S."""
    now = time.monotonic()
    if now - _asked[0] >= ASKED_EVERY_S:
        _asked[:] = [now, kernel_synchronised()]
    return _asked[1]
