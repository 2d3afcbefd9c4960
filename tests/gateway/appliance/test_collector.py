"""The gateway's collector settings: start-up objects frozen, young generation collected rarely."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from gateway.appliance.collector import DEFAULT_THRESHOLDS, GEN0_THRESHOLD, release_after_stop, settle_after_start


@pytest.fixture
def restore_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restore_collector")
def test_settle_freezes_start_up_objects_and_raises_the_threshold() -> None:
    gc.unfreeze()
    kept = [[index] for index in range(1000)]  # long-lived containers built "at start-up"
    settle_after_start()
    assert gc.get_freeze_count() >= len(kept)
    assert gc.get_threshold()[0] == GEN0_THRESHOLD


@pytest.mark.usefixtures("restore_collector")
def test_release_hands_everything_back() -> None:
    settle_after_start()
    release_after_stop()
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == DEFAULT_THRESHOLDS
