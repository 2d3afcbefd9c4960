"""What a hostile request costs the other clients: a bystander's one-triple update, sent while the
hostile request runs on the same gateway, and how long it waited (the update thread is one)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from tools.launcher import Reply, RunningGateway


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
