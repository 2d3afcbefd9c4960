"""broker.quiet_log: what a client can cause on every request is logged once per interval at most,
each line saying how many happened since the last one, and every one of them is counted."""

from __future__ import annotations

import logging
import time

import pytest

from broker.quiet_log import QuietLog


def test_one_line_per_interval_with_the_count_since(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("tests.quiet_log")
    caplog.set_level(logging.INFO, logger=logger.name)
    refusals = QuietLog(logger, "refused", every_s=0.5)
    for number in range(50):
        refusals(peer=f"p{number}")
    time.sleep(0.6)
    refusals(peer="late")
    lines = [(record.getMessage(), record.peer, record.refused) for record in caplog.records]
    assert lines == [("refused", "p0", 1), ("refused", "late", 50)]
    assert refusals.total == 51
