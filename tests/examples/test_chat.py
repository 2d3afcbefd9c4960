"""The chat example (examples/chat/chat.py) end to end, over both transports with the same code.

What it protects: the application of seed 000 §5.4 built on Producer/Aggregator works on the
network transport (real sockets, a `sepa-gateway run` subprocess) and on the in-process transport
(an Engine behind a Scheduler), through the `connect` fixture that runs each test on both:

* two users exchanging 20 messages each way, concurrently, each get every message addressed to
  them exactly once, in the order its sender sent it (the protocol guarantees that for a sender
  that awaits each SEND: the update's reply comes after every subscription processed it, and a
  subscription's notifications are numbered in update order);
* a message is removed only after its receipt was acknowledged (REMOVE deletes the receiving time
  too: 6 triples), and at the end the chat graph holds no message;
* a message whose SENT row changes (its sender renamed) is not delivered twice, and messages sent
  while the recipient was away are delivered when it joins;
* `python -m examples.chat.chat` runs against a gateway with its endpoints overridden, and in-process.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from pyoxigraph import Literal

from examples.chat.chat import ChatClient, load_jsap, main, messages_left
from tests.gateway.client.client_support import Connect, eventually, run
from tools.launcher import RunningGateway

ROOT = Path(__file__).resolve().parents[2]

CHAT = "http://wot.arces.unibo.it/chat#"
ANN, BOB = f"{CHAT}PersonURI1", f"{CHAT}PersonURI2"
N = 20
REMOVED_PER_MESSAGE = 6  # type, text, sender, toRecipient, dateSent + dateReceived (the acknowledgement)


def test_two_users_exchange_messages_exactly_once(connect: Connect) -> None:
    jsap = load_jsap()

    async def body() -> None:
        async with connect() as client_a, connect() as client_b:
            ann = ChatClient(client_a, jsap, ANN, "Ann")
            bob = ChatClient(client_b, jsap, BOB, "Bob")
            async with ann, bob:

                async def talk(me: ChatClient, to: ChatClient) -> None:
                    for index in range(N):
                        summary = await me.send(to.user, f'{me.name} #{index}: "quoted" }} ; DROP ALL')
                        assert summary.added == 5

                await asyncio.gather(talk(ann, bob), talk(bob, ann))
                for me in (ann, bob):
                    await me.wait_until(lambda me=me: len(me.receipts) >= N and len(me.messages) >= N, 20)
                await asyncio.sleep(0.1)  # anything extra (a duplicate) would arrive now
                for me, other in ((ann, bob), (bob, ann)):
                    # exactly once, from the other user, in send order
                    assert len(me.messages) == N
                    assert len({message.iri for message in me.messages}) == N
                    assert [message.text for message in me.messages] == [
                        f'{other.name} #{index}: "quoted" }} ; DROP ALL' for index in range(N)
                    ]
                    assert {(m.sender, m.sender_name, m.receiver) for m in me.messages} == {
                        (other.user, other.name, me.user)
                    }
                    assert me.receiver.acknowledged == N
                    # every message of mine was acknowledged by the other, then removed with its receipt
                    assert sorted(r.iri for r in me.receipts) == sorted(m.iri for m in other.messages)
                    assert {r.receiver for r in me.receipts} == {other.user}
                    assert all(r.received for r in me.receipts)
                    assert [r.removed for r in me.receipts] == [REMOVED_PER_MESSAGE] * N
                    assert me.remover.removed == N and me.failures == 0
                # the removals reached the receivers' views too
                await eventually(lambda: not ann.receiver.view.rows and not bob.receiver.view.rows, what="views")
                assert not ann.remover.view.rows and not bob.remover.view.rows
            assert await messages_left(client_a, jsap) == []
            assert client_a.subscriptions == [] and client_b.subscriptions == []

    run(body(), timeout=45)


def test_no_duplicate_when_a_row_changes_and_offline_delivery(connect: Connect) -> None:
    jsap = load_jsap()

    async def body() -> None:
        async with connect() as client_a, connect() as client_b:
            ann = ChatClient(client_a, jsap, ANN, "Ann")  # sends, but has not joined: nobody removes yet
            bob = ChatClient(client_b, jsap, BOB, "Bob")
            await ann.send(BOB, "while you were away")
            async with bob:  # joins: the waiting message is in SENT's first result
                await bob.wait_until(lambda: bob.receiver.acknowledged == 1, 5)
                assert [(m.text, m.sender_name) for m in bob.messages] == [("while you were away", None)]
                # Ann's name appears: the message's SENT row is removed and added again with the name
                await ann.registrar.produce(userName="Ann")
                await eventually(
                    lambda: [b.get("name") for b in bob.receiver.view.bindings()] == [Literal("Ann")],
                    what="renamed row",
                )
                await ann.send(BOB, "after the rename")  # notifications are handled in order: the rename first
                await bob.wait_until(lambda: len(bob.messages) >= 2, 5)
                assert [(m.text, m.sender_name) for m in bob.messages] == [
                    ("while you were away", None),
                    ("after the rename", "Ann"),
                ]
                assert await messages_left(client_a, jsap) != []  # acknowledged, but Ann has not removed them
                async with ann:  # Ann joins: her Remover finds both acknowledgements in its first result
                    await ann.wait_until(lambda: len(ann.receipts) == 2, 5)
                    assert [r.removed for r in ann.receipts] == [REMOVED_PER_MESSAGE] * 2
                await eventually(lambda: not bob.receiver.view.rows, what="removals seen by Bob")
            assert len(bob.messages) == 2 and bob.receiver.received == 2
            assert await messages_left(client_a, jsap) == []

    run(body())


def test_main_over_the_network_with_overridden_endpoints(gateway: RunningGateway) -> None:
    gateway.post_update("DROP ALL")
    command = [sys.executable, "-m", "examples.chat.chat", "--messages", "3"]
    command += ["--url", f"http://127.0.0.1:{gateway.http_port}", "--ws-url", gateway.subscribe_url]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sum("message from Client #1" in line for line in lines) == 3
    assert sum("message from Client #2" in line for line in lines) == 3
    assert sum("(removed 6 triples)" in line for line in lines) == 6
    assert lines[-1] == "6 messages sent, 0 left in the chat graph"
    assert done.stderr == ""


def test_main_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--inprocess", "--messages", "2"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "4 messages sent, 0 left in the chat graph"


def test_main_reports_an_unreachable_broker_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--url", "http://127.0.0.1:1", "--messages", "1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot connect" in err
