"""adapters.mqtt.deliveries: which delivery records an update deletes, when a batch is stored by
several updates (MqttAdapter.commit cuts a batch at batch_max_readings).

What it protects: the records of a batch's messages stay in the store until two batches after it
was acknowledged. Deleting them while the batch is still being stored (its messages not
acknowledged yet) let a kill between that update and the acknowledgement store the redelivered
messages twice.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from pyoxigraph import Literal, NamedNode, Quad

from adapters.mqtt.connection import Message
from adapters.mqtt.deliveries import DIGEST, GRAPH, SUBJECT, Deliveries, digest
from broker.api import Update


def message(mid: int, *, dup: bool = False, connection: int = 1) -> Message:
    return Message(f"gateway/s{mid}/temperature", str(mid).encode(), mid, 1, dup, False, 0, connection)


def store(deliveries: Deliveries, mids: list[int], *, connection: int = 1, live: int = 1) -> set[int]:
    """One update recording `mids` (delivered on `connection`, `live` up now), committed: the message
    ids whose records it deleted."""
    messages = [message(mid, connection=connection) for mid in mids]
    _, added, deleted = deliveries.record(Update(()), messages, live)
    deliveries.settle(added, deleted)
    return {int(quad.subject.value.rsplit(":", 1)[1]) for quad in deleted}


def batch(deliveries: Deliveries, mids: list[int], *, dup: bool, connection: int = 1, live: int = 1) -> set[int]:
    """One batch as MqttAdapter.commit makes it: each message checked, the new ones stored, the batch
    closed. The message ids whose records it deleted."""
    fresh = [mid for mid in mids if not deliveries.committed(message(mid, dup=dup, connection=connection))]
    deleted = store(deliveries, fresh, connection=connection, live=live) if fresh else set()
    deliveries.close_batch()
    return deleted


def test_a_batch_in_several_updates_deletes_nothing_of_its_own_and_what_two_batches_back_recorded() -> None:
    deliveries = Deliveries(hold_s=0)
    assert store(deliveries, [1, 2]) == set()  # batch 0, one update
    deliveries.close_batch()
    assert store(deliveries, [3]) == set()  # batch 1, one update
    deliveries.close_batch()
    # batch 2 in three updates: the first deletes batch 0's records, none deletes the batch's own
    assert [store(deliveries, [mid]) for mid in (4, 5, 6)] == [{1, 2}, set(), set()]
    assert all(deliveries.committed(message(mid, dup=True)) for mid in (3, 4, 5, 6))
    deliveries.close_batch()
    assert store(deliveries, [7]) == {3}  # batch 3: batch 1's
    deliveries.close_batch()
    assert store(deliveries, [8]) == {4, 5, 6}  # batch 4: all of batch 2's, in one update
    assert not deliveries.committed(message(4, dup=True)) and deliveries.committed(message(7, dup=True))


def test_records_loaded_at_a_restart_last_until_the_redeliveries_are_over() -> None:
    """A kill -9 with 1,000 messages unacknowledged: the broker resends them all first, in batches of
    any size. Deleted two batches after the restart, the loaded records missed the redeliveries of
    the third batch on, and those readings were stored twice (the kill -9 test, 1 in 3,000)."""
    deliveries = Deliveries(hold_s=0)
    deliveries.load({"d": NamedNode(f"{SUBJECT}{mid}"), "digest": Literal(digest(message(mid)))} for mid in range(10))
    for mids in ([0, 1], [2, 3, 4], [5], [6, 7], [8, 9]):  # five batches of redeliveries, new connection 3
        batch(deliveries, mids, dup=True, connection=3, live=3)
    assert deliveries.duplicates == 10
    assert batch(deliveries, [100], dup=False, connection=3, live=3) == set(range(10))  # the first new message


def test_records_of_a_dropped_connection_last_until_the_next_one_resends() -> None:
    """Committed after their connection dropped, messages cannot be acknowledged (the broker
    redelivers them on the next): their records outlive two batches, while those of the live
    connection are deleted as usual, so the records stay bounded."""
    deliveries = Deliveries(hold_s=0)
    batch(deliveries, [1, 2], dup=False, connection=1, live=2)  # batch 0: connection 1 had dropped (2)
    # connection 3 delivers only DUP messages (mids 3..6, never committed): its records go two batches on
    assert [batch(deliveries, [mid], dup=True, connection=3, live=3) for mid in (3, 4, 5, 6)] == [
        set(),
        set(),
        {3},
        {4},
    ]
    assert deliveries.committed(message(1, dup=True, connection=3))  # batch 0's are still recognised
    assert batch(deliveries, [7], dup=False, connection=3, live=3) == {1, 2, 5}  # the redeliveries are over


def test_a_message_twice_in_one_batch_across_a_reconnect_is_stored_once() -> None:
    """Received, then its connection dropped before the batch was taken, and redelivered on the next
    into the same batch: the second copy is recognised."""
    deliveries = Deliveries(hold_s=0)
    assert not deliveries.committed(message(7, connection=1))
    assert deliveries.committed(message(7, dup=True, connection=3))
    assert not deliveries.committed(message(8, dup=True, connection=3))  # another message: not a copy
    assert deliveries.duplicates == 1


def test_a_batch_retried_after_a_failed_update_keeps_the_records_of_its_first_attempt() -> None:
    """A store failure after the first update of a batch: the ingestor retries the same batch (not
    closed), and the records its first update wrote stay until two batches after it."""
    deliveries = Deliveries(hold_s=0)
    for mids in ([1], [2]):
        store(deliveries, mids)
        deliveries.close_batch()
    assert store(deliveries, [3]) == {1}  # batch 2's first update; then one fails
    assert store(deliveries, [4]) == set()  # the retry's update: still batch 2
    deliveries.close_batch()
    assert store(deliveries, [5]) == {2}
    deliveries.close_batch()
    assert store(deliveries, [6]) == {3, 4}


def test_records_stay_hold_s_after_their_acknowledgement_however_fast_batches_come() -> None:
    """Batches may follow each other within milliseconds, faster than paho's thread writes the
    acknowledgements: two batches on, a kill could still lose them. Records stay HOLD_S after the
    batch closed, and HOLD_S after a later connection's redeliveries were over."""
    now = [0.0]
    deliveries = Deliveries(clock=lambda: now[0], hold_s=2.0)
    batch(deliveries, [1], dup=False)
    assert [batch(deliveries, [mid], dup=False) for mid in (2, 3, 4)] == [set(), set(), set()]
    now[0] = 2.0
    assert batch(deliveries, [5], dup=False) == {1, 2, 3}  # batch 3's closed less than two batches ago
    batch(deliveries, [6], dup=False, connection=1, live=2)  # committed after connection 1 dropped
    now[0] = 3.0
    batch(deliveries, [7], dup=False, connection=3, live=3)  # connection 3's first new message, at 3.0
    now[0] = 4.9
    assert 6 not in batch(deliveries, [8], dup=False, connection=3, live=3)
    now[0] = 5.0
    assert 6 in batch(deliveries, [9], dup=False, connection=3, live=3)


@given(st.lists(st.tuples(st.integers(1, 65535), st.binary(max_size=20), st.sampled_from([0, 1, 2])), max_size=10))
def test_a_record_is_the_quad_of_its_message_id_and_digest(sent: list[tuple[int, bytes, int]]) -> None:
    """The records are made from N-Quads lines (gateway.observations.nquads): each must be the quad
    `Quad(...)` makes of the message's id and digest, one per message of QoS 1 or 2, in order; the
    digest `committed` found for a message (every other one here) is the one recorded."""
    messages = [Message("gateway/s/temperature", payload, mid, qos, False, False, 0, 1) for mid, payload, qos in sent]
    deliveries = Deliveries()
    for each in messages[::2]:
        deliveries.committed(each)
    _, added, _ = deliveries.record(Update(()), messages, 1)
    expected = [
        Quad(NamedNode(f"{SUBJECT}{each.mid}"), DIGEST, Literal(digest(each)), GRAPH) for each in messages if each.qos
    ]
    assert added == expected
