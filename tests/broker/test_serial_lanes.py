"""The serial queue's lanes: one call per lane in turn, a lane's calls in order, a client's lane bounded."""

from __future__ import annotations

import pytest

from broker.serial_lanes import LaneFull, SerialLanes


def test_lanes_take_turns_and_keep_their_own_order() -> None:
    lanes: SerialLanes[str] = SerialLanes(lane_limit=10)
    for item in ("h1", "h2", "h3"):
        lanes.append(item, "hog")
    lanes.append("o1", "other")
    lanes.append("n1")
    lanes.append("o2", "other")
    assert len(lanes) == 6
    taken = [lanes.popleft() for _ in range(6)]
    assert taken == ["h1", "o1", "n1", "h2", "o2", "h3"]
    assert not lanes
    with pytest.raises(IndexError):
        lanes.popleft()


def test_a_client_lane_is_bounded_the_shared_lane_is_not() -> None:
    lanes: SerialLanes[int] = SerialLanes(lane_limit=2)
    lanes.append(1, "hog")
    lanes.append(2, "hog")
    with pytest.raises(LaneFull):
        lanes.append(3, "hog")
    for item in range(5):
        lanes.append(item)  # the scheduler's queue bounds the shared lane
    lanes.append(1, "other")
    assert len(lanes) == 8
