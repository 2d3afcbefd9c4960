"""The CoAP delivery records (adapters/coap/deliveries.py): a message ID is recognised for
EXCHANGE_LIFETIME after its commit, and no longer, however long the record waits to be deleted."""

from __future__ import annotations

from pyoxigraph import Literal, NamedNode, Store

from adapters.coap.deliveries import EXCHANGE_LIFETIME_S, QUERY, SUBJECT, Deliveries, delivery


def test_a_record_is_not_recognised_past_the_exchange_lifetime_before_a_batch_deleted_it() -> None:
    now = [1_000.0]
    deliveries = Deliveries(clock=lambda: now[0])
    item = delivery("192.0.2.7:5683", 4242, "s/reuse/temperature", b"21.5")
    request, expired = deliveries.amend("INSERT DATA {}", [item])
    deliveries.settle([item], expired)
    now[0] += EXCHANGE_LIFETIME_S - 1
    assert deliveries.committed(item)  # a retransmission: answered, not stored again
    now[0] += 2  # the sensor may reuse the message ID; no batch ran meanwhile (a quiet gateway)
    assert not deliveries.committed(item)
    assert deliveries.duplicates == 1

    # the new commit records it again, in the update that deletes the expired record
    request, expired = deliveries.amend("INSERT DATA {}", [item])
    assert len(expired) == 1 and isinstance(request, str) and "DELETE DATA" in request
    deliveries.settle([item], expired)
    assert deliveries.committed(item)
    now[0] += EXCHANGE_LIFETIME_S + 1
    assert not deliveries.committed(item)


def test_records_loaded_at_start_are_recognised_for_a_lifetime_from_then() -> None:
    now = [50.0]
    deliveries = Deliveries(clock=lambda: now[0])
    key, digest = delivery("127.0.0.1:40000", 7, "s/a/b", b"1")
    deliveries.load([{"d": NamedNode(SUBJECT + key), "digest": Literal(digest)}])
    assert deliveries.committed((key, digest))
    now[0] += EXCHANGE_LIFETIME_S + 1
    assert not deliveries.committed((key, digest))


def test_an_ipv6_sensors_record_is_stored_and_recognised_after_a_restart() -> None:
    """An IPv6 endpoint (brackets, a zone) is no IRI as it is: every confirmable reading from an IPv6
    sensor was refused 5.03 (ValueError making the record's quad)."""
    item = delivery("[fe80::1%eth0]:5683", 7, "s/boiler/temperature", b"71.5")
    request, _ = Deliveries().amend("INSERT DATA {}", [item])
    assert isinstance(request, str)
    store = Store()
    store.update(request)
    restarted = Deliveries()
    restarted.load(dict(zip(("d", "digest"), row, strict=True)) for row in store.query(QUERY))
    assert restarted.committed(item)
