"""What a hostile request costs the other clients: a bystander's one-triple update, sent while the
hostile request runs on the same gateway, and how long it waited (the update thread is one); or a
client asking back to back for as long as hostile input is being processed (:func:`served_meanwhile`)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field

from tools.launcher import Endpoint, Reply, RunningGateway


def bystander_wait(
    gateway: RunningGateway,
    hostile: str,
    *,
    head_start_s: float = 0.3,
    params: Sequence[tuple[str, str]] = (),
) -> tuple[Reply, float]:
    """Send the update `hostile` (with the URL's `params`), then (after `head_start_s`) a
    bystander's update: the hostile request's reply and the seconds the bystander waited for its 200."""
    replies: list[Reply] = []
    attack = threading.Thread(target=lambda: replies.append(gateway.update(hostile, params=params)))
    attack.start()
    time.sleep(head_start_s)
    started = time.monotonic()
    assert gateway.update("INSERT DATA { <http://example.org/bystander> <http://example.org/p> 1 }").status == 200
    waited = time.monotonic() - started
    attack.join()
    return replies[0], waited


@dataclass
class Asked:
    """The answers of a client that asked back to back: (monotonic time sent, seconds waited) each."""

    answers: list[tuple[float, float]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def waits(self) -> list[float]:
        return [waited for _, waited in self.answers]

    def between(self, start: float, end: float) -> list[float]:
        """The waits of the asks that were in flight at some moment of [start, end]."""
        return [waited for sent, waited in self.answers if sent <= end and sent + waited >= start]


@contextmanager
def served_meanwhile(send: Callable[[int], Reply], every_s: float = 0.01) -> Iterator[Asked]:
    """A client on a thread calling `send(n)` (n = 1, 2, ...) every `every_s` while the block runs
    (and the request in flight when it ends), each reply timed. A reply other than 200, or an
    exception, is kept in `failures` and fails the test on leaving the block: an assert on the
    thread would only end the thread (pytest merely warns), and the test then measured the replies
    that came before, a request that hung past its timeout never counted."""
    asked = Asked()
    stop = threading.Event()

    def ask() -> None:
        for number in itertools.count(1):
            if stop.is_set():
                return
            sent = time.monotonic()
            try:
                reply = send(number)
            except Exception as error:  # a refused or timed-out connection: the failure is the finding
                asked.failures.append(f"after {time.monotonic() - sent:.2f} s: {error!r}")
                return
            asked.answers.append((sent, time.monotonic() - sent))
            if reply.status != 200:
                asked.failures.append(f"{reply.status} {reply.body[:200]!r}")
                return
            stop.wait(every_s)

    client = threading.Thread(target=ask, name="served-meanwhile", daemon=True)
    client.start()
    try:
        yield asked
    finally:
        stop.set()
        client.join(120)
    assert not client.is_alive(), "the last request had no reply in 120 s"
    assert not asked.failures, asked.failures


def asking_meanwhile(gateway: Endpoint, query: str = "ASK { }", every_s: float = 0.01) -> AbstractContextManager[Asked]:
    """`served_meanwhile` with a client sending `query` to `gateway`."""
    return served_meanwhile(lambda _: gateway.query(query), every_s)
