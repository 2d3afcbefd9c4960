"""SyncSepaClient: the same client for scripts without asyncio, on both transports.

What it protects: blocking query/update/subscribe/unsubscribe/close work from a plain thread,
callbacks arrive in order on the client's own thread with the view already updated, and a
callback that calls a blocking method gets a clear error instead of a deadlock; delayed updates are
scheduled, listed and cancelled with blocking calls too.
"""

from __future__ import annotations

import queue
import threading
from datetime import UTC, datetime, timedelta

import pytest

from broker.api import Engine, Notification
from gateway.client import InProcessTransport, NetworkTransport, Scheduled, SepaClientError, SyncSepaClient
from tools.launcher import RunningGateway

PREFIX = "PREFIX ex: <http://example.org/>\n"
QUERY = PREFIX + "SELECT ?o WHERE { ex:a ex:p ?o }"


@pytest.fixture(params=["inprocess", "network"])
def sync_client(request: pytest.FixtureRequest) -> SyncSepaClient:
    if request.param == "inprocess":
        return SyncSepaClient(InProcessTransport(Engine()))
    gateway: RunningGateway = request.getfixturevalue("gateway")
    gateway.post_update("DROP ALL")
    return SyncSepaClient(lambda: NetworkTransport(*gateway.endpoints))


def test_blocking_calls_and_callbacks(sync_client: SyncSepaClient) -> None:
    received: queue.Queue[tuple[Notification, int, str]] = queue.Queue()
    errors: list[BaseException] = []

    with sync_client as client:

        def on_notification(notification: Notification) -> None:
            received.put(
                (notification, len(subscription.view) if notification.sequence else 0, threading.current_thread().name)
            )
            if notification.sequence == 1:
                try:
                    client.query(QUERY)  # would wait for its own thread
                except RuntimeError as error:
                    errors.append(error)

        subscription = client.subscribe(QUERY, on_notification, alias="sync")
        first, _, thread = received.get(timeout=5)
        assert first.sequence == 0 and thread == "sepa-sync-client"
        summary = client.update(PREFIX + "INSERT DATA { ex:a ex:p 1, 2 }")
        assert (summary.added, summary.removed) == (2, 0)
        second, view_size, _ = received.get(timeout=5)
        assert second.sequence == 1 and len(second.added) == 2 and view_size == 2
        assert subscription.view == client.query(QUERY) and subscription.alias == "sync"
        assert len(errors) == 1
        subscription.unsubscribe()
        client.update(PREFIX + "INSERT DATA { ex:a ex:p 3 }")
        with pytest.raises(queue.Empty):
            received.get(timeout=0.3)
        with pytest.raises(SepaClientError) as refused:
            client.update("INSERT DATA { nonsense }")
        assert refused.value.status_code == 400
    client.close()  # idempotent


def test_delayed_updates_from_a_plain_thread(sync_client: SyncSepaClient) -> None:
    received: queue.Queue[Notification] = queue.Queue()
    with sync_client as client:
        client.subscribe(QUERY, received.put, alias="delayed")
        assert received.get(timeout=5).sequence == 0
        scheduled = client.update(PREFIX + "INSERT DATA { ex:a ex:p 1 }", delay=200)
        assert isinstance(scheduled, Scheduled) and scheduled.due.tzinfo == UTC
        later = client.update(PREFIX + "INSERT DATA { ex:a ex:p 2 }", at=datetime.now(UTC) + timedelta(seconds=30))
        assert [entry.id for entry in client.scheduled()] == [scheduled.id, later.id]
        assert client.cancel_scheduled(later.id).due == later.due
        note = received.get(timeout=5)
        assert note.sequence == 1 and datetime.now(UTC) >= scheduled.due
        assert client.scheduled() == []
        with pytest.raises(SepaClientError) as unknown:
            client.cancel_scheduled(later)
        assert unknown.value.status_code == 404
        with pytest.raises(queue.Empty):
            received.get(timeout=0.2)  # nothing else ran
