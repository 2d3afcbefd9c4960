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


def test_a_lane_whose_last_call_ran_long_is_named_before_its_turn() -> None:
    """The scheduler ends a group commit before such a lane's turn, so the replies of the calls
    before it do not wait for its next call too."""
    lanes: SerialLanes[str] = SerialLanes(lane_limit=10)
    lanes.append("h1", "hog")
    lanes.append("h2", "hog")
    lanes.append("o1", "other")
    lane, item = lanes.pop()
    assert (lane, item) == ("hog", "h1") and not lanes.next_is_slow()
    lanes.ran("hog", slow=True)
    assert lanes.pop() == ("other", "o1")
    assert lanes.next_is_slow()  # h2 is next
    lanes.ran("hog", slow=False)
    assert not lanes.next_is_slow()
