"""sepy, unmodified, over the secure gates with the secure profile it ships (testSecure.ysap).

Only host and ports are changed in the profile. sepy registers itself (its client_id is the
identity, allowed in the gateway's TOML), gets tokens, sends them as PROTOCOL.md says clients in
the field do (a bare JWT beside the subscribe request; "Bearer" inside unsubscribe), and does not
verify the certificate (its own choice). Its secure query path swaps the registration and token
URLs: a SEPA instance whose first request is a query exercises that too.
"""

from __future__ import annotations

import json
import logging
import queue
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from sepy.SAPObject import SAPObject
from sepy.SEPA import SEPA

from tools.launcher import RunningGateway, launch_gateway

TEST_NS = "http://wot.arces.unibo.it/test#"


def secure_profile(gateway: RunningGateway) -> dict[str, Any]:
    profile = yaml.safe_load((resources.files("sepy.tests") / "testSecure.ysap").read_text(encoding="utf-8"))
    https, wss = urlsplit(gateway.https_url).port, urlsplit(gateway.wss_url).port
    profile["host"] = "localhost"
    profile["oauth"]["register"] = f"https://localhost:{https}/oauth/register"
    profile["oauth"]["tokenRequest"] = f"https://localhost:{https}/oauth/token"
    profile["sparql11protocol"]["port"] = https
    profile["sparql11seprotocol"]["availableProtocols"]["wss"]["port"] = wss
    return profile


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    folder: Path = tmp_path_factory.mktemp("sepy-secure")
    config = folder / "gateway.toml"
    config.write_text(
        "[security]\nclients = ["
        '{identity = "sepy-app", read = ["*"], write = ["*"]}, {identity = "sepy-reader", read = ["*"]}]\n'
    )
    running = launch_gateway("--secure", "--no-mqtt", config=config, data_dir=folder / "data")
    yield running
    assert running.stop() == 0


def rows(bindings: list[dict[str, Any]]) -> list[str]:
    return sorted(json.dumps(row, sort_keys=True) for row in bindings)


def test_sepy_update_query_subscribe_unsubscribe_over_the_secure_gates(gateway: RunningGateway) -> None:
    sepa = SEPA(sapObject=SAPObject(secure_profile(gateway), log=logging.ERROR), client_id="sepy-app")
    assert json.loads(sepa.update("INSERT_GREETING"))["added"] == 1
    answer = sepa.query("QUERY_GREETINGS")
    assert [row["qualcosa"]["value"] for row in answer["results"]["bindings"]] == ["Ciao"]
    inbox: queue.Queue[tuple[list, list]] = queue.Queue()
    spuid = sepa.subscribe("QUERY_GREETINGS", "greetings", handler=lambda added, removed: inbox.put((added, removed)))
    added, _ = inbox.get(timeout=5)
    assert [row["qualcosa"]["value"] for row in added] == ["Ciao"]
    sepa.update("INSERT_VARIABLE_GREETING", forcedBindings={"nome": TEST_NS + "Fabio", "qualcosa": "Hello"})
    added, removed = inbox.get(timeout=5)
    assert ([row["qualcosa"]["value"] for row in added], removed) == (["Hello"], [])
    assert gateway.metrics()["sepa_subscriptions"] == 1
    sepa.unsubscribe(spuid)  # with its token: accepted (the gateway ends only a client's own)
    deadline = time.monotonic() + 5
    while gateway.metrics()["sepa_subscriptions"] != 0:
        assert time.monotonic() < deadline, "sepy's unsubscribe was not accepted"
        time.sleep(0.05)


def test_sepy_starting_with_a_query_and_a_reader_that_may_not_write(gateway: RunningGateway) -> None:
    reader = SEPA(sapObject=SAPObject(secure_profile(gateway), log=logging.ERROR), client_id="sepy-reader")
    answer = reader.query("QUERY_GREETINGS")  # registers and gets its token through the swapped URLs
    assert "results" in answer
    with pytest.raises(ValueError):  # sepy raises on a non-200 reply: here 403
        reader.update("INSERT_GREETING")
    stranger = SEPA(sapObject=SAPObject(secure_profile(gateway), log=logging.ERROR), client_id="stranger")
    with pytest.raises(Exception):  # noqa: B017 - sepy's RegistrationFailedException: not allowed to register
        stranger.update("INSERT_GREETING")


def test_sepy_ends_its_subscription_after_its_token_expired(tmp_path: Path) -> None:
    """sepy never renews the token of its socket: its unsubscribe carries the token it subscribed
    with. Once that expired, the unsubscribe was a 401 (which sepy cannot read) and the subscription
    lived on, notified, until the socket closed. A token of ours past its expiry may end the
    subscriptions of its own client (ending takes access away); anything else is still refused."""
    config = tmp_path / "gateway.toml"
    config.write_text(
        '[security]\ntoken_lifetime_s = 10\nclients = [{identity = "sepy-app", read = ["*"], write = ["*"]}]\n'
    )
    gateway = launch_gateway("--secure", "--no-mqtt", config=config, data_dir=tmp_path / "data")
    try:
        sepa = SEPA(sapObject=SAPObject(secure_profile(gateway), log=logging.ERROR), client_id="sepy-app")
        inbox: queue.Queue[tuple[list, list]] = queue.Queue()
        spuid = sepa.subscribe(
            "QUERY_GREETINGS", "greetings", handler=lambda added, removed: inbox.put((added, removed))
        )
        inbox.get(timeout=5)
        assert gateway.metrics()["sepa_subscriptions"] == 1
        time.sleep(11)  # past the token's 10 s
        sepa.unsubscribe(spuid)
        deadline = time.monotonic() + 5
        while gateway.metrics()["sepa_subscriptions"] != 0:
            assert time.monotonic() < deadline, "sepy's unsubscribe with its expired token was refused"
            time.sleep(0.05)
    finally:
        assert gateway.stop() == 0
