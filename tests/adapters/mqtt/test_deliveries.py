"""adapters.mqtt.deliveries: which delivery records an update deletes, when a batch is stored by
several updates (MqttAdapter.commit cuts a batch at batch_max_readings).

What it protects: the records of a batch's messages stay in the store until two batches after it
was acknowledged. Deleting them while the batch is still being stored (its messages not
acknowledged yet) let a kill between that update and the acknowledgement store the redelivered
messages twice.
"""

from __future__ import annotations

from adapters.mqtt.connection import Message
from adapters.mqtt.deliveries import Deliveries
from broker.api import Update


def message(mid: int, *, dup: bool = False) -> Message:
    return Message(f"gateway/s{mid}/temperature", str(mid).encode(), mid, 1, dup, False, 0, 1)


def store(deliveries: Deliveries, mids: list[int]) -> set[int]:
    """One update recording `mids`, committed: the message ids whose records it deleted."""
    _, added, deleted = deliveries.record(Update(()), [message(mid) for mid in mids])
    deliveries.settle(added, deleted)
    return {int(quad.subject.value.rsplit(":", 1)[1]) for quad in deleted}


def test_a_batch_in_several_updates_deletes_nothing_of_its_own_and_what_two_batches_back_recorded() -> None:
    deliveries = Deliveries()
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


def test_a_batch_retried_after_a_failed_update_keeps_the_records_of_its_first_attempt() -> None:
    """A store failure after the first update of a batch: the ingestor retries the same batch (not
    closed), and the records its first update wrote stay until two batches after it."""
    deliveries = Deliveries()
    for mids in ([1], [2]):
        store(deliveries, mids)
        deliveries.close_batch()
    assert store(deliveries, [3]) == {1}  # batch 2's first update; then one fails
    assert store(deliveries, [4]) == set()  # the retry's update: still batch 2
    deliveries.close_batch()
    assert store(deliveries, [5]) == {2}
    deliveries.close_batch()
    assert store(deliveries, [6]) == {3, 4}
