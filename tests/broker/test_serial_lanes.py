"""The serial queue's lanes: one call per lane in turn, a lane's calls in order, a client's lane bounded."""

from __future__ import annotations

import pytest

from broker.serial_lanes import DUE_SHARED, LaneFull, SerialLanes


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


def test_due_calls_go_first_in_their_lane_and_take_turns_with_the_others() -> None:
    """Delayed updates falling due: before, they ran ahead of every lane, so one client's due
    updates that each ran to the time limit held everyone's updates behind all of them."""
    lanes: SerialLanes[str] = SerialLanes(lane_limit=2)
    lanes.append("o1", "other")
    lanes.append("o2", "other")
    lanes.append("h1", "hog")
    lanes.append("h2", "hog")
    lanes.append_due("d1", "hog")
    lanes.append_due("d2", "hog")  # never refused, though the lane holds its limit
    lanes.append_due("n1")  # a lane with nothing queued takes the next turn
    with pytest.raises(LaneFull):
        lanes.append("h3", "hog")
    assert len(lanes) == 7
    assert [lanes.pop() for _ in range(7)] == [
        (DUE_SHARED, "n1"),
        ("other", "o1"),
        ("hog", "d1"),
        ("other", "o2"),
        ("hog", "d2"),
        ("hog", "h1"),
        ("hog", "h2"),
    ]
    assert not lanes


def test_the_shared_lanes_due_calls_take_turns_with_it() -> None:
    """10,000 delayed updates a plain client scheduled to fall due at once ran ahead of the shared
    lane, where the plain gates' other clients and the sensors' readings wait: a bystander's
    one-triple update waited 87 s. They have a lane of their own now, taking turns with it."""
    lanes: SerialLanes[str] = SerialLanes(lane_limit=2)
    for number in range(100):
        lanes.append_due(f"d{number}")
    lanes.append("bystander")
    assert [lanes.pop() for _ in range(3)] == [(DUE_SHARED, "d0"), (None, "bystander"), (DUE_SHARED, "d1")]
