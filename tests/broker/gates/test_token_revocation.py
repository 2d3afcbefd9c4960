"""Revoking a token (RFC 7009, POST /oauth/revoke) ends the WSS subscriptions made with it, on any
socket, within the revocation watch's second, and nothing else: over real TLS sockets.

Before, the token was refused from then on but its subscriptions lived on: a thief who subscribed
with a stolen token kept reading its client's graphs after the owner revoked it, until the operator
reset the client (docs/security.md, "Revocation")."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from broker.security import revocations, tokens
from tests.broker.gates.secure_support import ADMIN, Credentials, SecureClient, receive, secure_config
from tests.broker.gates.test_secure_gates import EX, PUBLIC, VIEWER, WRITER, attack_tokens, run_secure
from tests.polling import wait_until
from tools.launcher import STOP_TIMEOUT_S, InProcessGateway, start_in_process

WATCHED = f"SELECT ?o WHERE {{ GRAPH <{PUBLIC}> {{ <{EX}lamp> <{EX}dim> ?o }} }}"
# not timing: on a loaded CI machine the watch's second can take several; the test's point is
# that the frames come, and that nothing else ends
FRAME_TIMEOUT_S = 30.0


@pytest.fixture
def gateway(in_process_gateway: Callable[..., InProcessGateway], tmp_path: Path) -> InProcessGateway:
    return in_process_gateway(secure_config(ADMIN, VIEWER, WRITER, data_dir=str(tmp_path / "data")))


async def credentials(client: SecureClient, identity: str) -> Credentials:
    status, document = await client.register(identity)
    assert status == 201, document
    return Credentials(document["credentials"]["client_id"], document["credentials"]["client_secret"])


async def revoke(client: SecureClient, token: str) -> None:
    """RFC 7009 as a form: 200 whatever the token is."""
    url = f"{client.https_url}/oauth/revoke"
    async with client.session.post(url, data={"token": token}, ssl=client.ssl) as reply:
        assert (reply.status, await reply.json()) == (200, {})


async def subscribe(ws: aiohttp.ClientWebSocketResponse, token: str, alias: str, sparql: str = WATCHED) -> str:
    """Subscribe with `token` and return the spuid of its confirmation."""
    await ws.send_json({"subscribe": {"sparql": sparql, "alias": alias, "authorization": f"Bearer {token}"}})
    reply = await receive(ws, timeout=FRAME_TIMEOUT_S)
    assert reply.get("notification", {}).get("sequence") == 0, reply
    return str(reply["notification"]["spuid"])


async def set_dim(client: SecureClient, writer: str, value: int) -> None:
    update = (
        f"DELETE WHERE {{ GRAPH <{PUBLIC}> {{ <{EX}lamp> <{EX}dim> ?v }} }} ; "
        f"INSERT DATA {{ GRAPH <{PUBLIC}> {{ <{EX}lamp> <{EX}dim> {value} }} }}"
    )
    assert (await client.update(writer, update))[0] == 200


async def added(ws: aiohttp.ClientWebSocketResponse, spuid: str, value: int) -> None:
    """The next frame is `spuid`'s notification adding `value`."""
    reply = await receive(ws, timeout=FRAME_TIMEOUT_S)
    notification = reply.get("notification", {})
    assert notification.get("spuid") == spuid, reply
    assert [row["o"]["value"] for row in notification["addedResults"]["results"]["bindings"]] == [str(value)]


async def revoked_count(client: SecureClient, gateway: InProcessGateway) -> int:
    """sepa_ws_revoked_subscriptions_total, as the plain port's /metrics shows it (0 before any)."""
    async with client.session.get(f"{gateway.http_url}/metrics") as reply:
        for line in (await reply.text()).splitlines():
            name, _, value = line.partition(" ")
            if name == "sepa_ws_revoked_subscriptions_total":
                return int(value)
    return 0


def test_revoking_a_token_ends_the_subscriptions_made_with_it_on_every_socket_and_nothing_else(
    gateway: InProcessGateway,
) -> None:
    """Two sockets of the thief's token, one of which also holds a subscription made with another
    token of the same client, and another client's socket: only the thief's two end, each with a
    401 frame naming it; the rest are notified of the next update. Revoking it again ends nothing."""

    async def test(client: SecureClient) -> None:
        viewer = await credentials(client, "viewer")
        stolen, kept = await client.token(viewer), await client.token(viewer)
        writer = await client.login("writer")
        first, second, bystander = await client.socket(), await client.socket(), await client.socket()
        thief_1 = await subscribe(first, stolen, "thief-1")
        owner = await subscribe(first, kept, "owner")
        thief_2 = await subscribe(second, stolen, "thief-2")
        other = await subscribe(bystander, writer, "writer")
        await revoke(client, stolen)
        for ws, spuid, alias in ((first, thief_1, "thief-1"), (second, thief_2, "thief-2")):
            ended = await receive(ws, timeout=FRAME_TIMEOUT_S)
            assert (ended.get("error"), ended.get("status_code"), ended.get("spuid"), ended.get("alias")) == (
                "invalid_grant",
                401,
                spuid,
                alias,
            ), ended
        assert gateway.gateway.engine.subscription_count == 2
        await set_dim(client, writer, 11)
        await added(first, owner, 11)  # same socket, same client, another token: goes on
        await added(bystander, other, 11)
        with pytest.raises(asyncio.TimeoutError):
            await receive(second, timeout=1.5)
        await revoke(client, stolen)  # twice: nothing more to end
        await asyncio.sleep(2.5)  # two turns of the watch
        assert gateway.gateway.engine.subscription_count == 2
        assert await revoked_count(client, gateway) == 2
        for ws in (first, second, bystander):
            await ws.close()

    run_secure(gateway, test)


def test_revoking_garbage_or_another_clients_token_ends_nothing(gateway: InProcessGateway) -> None:
    """Every bad token built from the viewer's own claims (its jti and sub, forged, unsigned, expired,
    another issuer...), garbage, and the writer's valid token: 200 each (RFC 7009), and the viewer's
    subscription goes on."""

    async def test(client: SecureClient) -> None:
        viewer = await client.login("viewer")
        writer = await client.login("writer")
        ws = await client.socket()
        spuid = await subscribe(ws, viewer, "viewer")
        for name, token in attack_tokens(gateway, viewer).items():
            if token:
                await revoke(client, token)
            else:  # nothing named: 400 (test_secure_gates), and nothing revoked either
                async with client.session.post(f"{client.https_url}/oauth/revoke", ssl=client.ssl) as reply:
                    assert reply.status == 400, name
        await revoke(client, writer)
        assert (await client.query(writer, WATCHED))[0] == 401
        await asyncio.sleep(2.5)  # two turns of the watch
        await set_dim(client, await client.login("admin"), 12)
        await added(ws, spuid, 12)
        assert await revoked_count(client, gateway) == 0
        await ws.close()

    run_secure(gateway, test)


def test_a_subscribe_in_flight_when_its_token_is_revoked_is_never_served(
    in_process_gateway: Callable[..., InProcessGateway], tmp_path: Path
) -> None:
    """The guarantee: once /oauth/revoke has answered 200, no subscription made with the token is
    confirmed, whether its subscribe was authenticated before the revocation or not. Here the
    subscribe waits for its turn behind its own client's endless query while the token is revoked:
    it must end with a 401 frame before any result, and see nothing written after."""
    config = secure_config(ADMIN, VIEWER, WRITER, data_dir=str(tmp_path / "data"))
    config.engine.time_limit_s, config.engine.query_workers = 2.0, 2
    gateway = in_process_gateway(config)
    scheduler = gateway.gateway.scheduler
    patterns = " ".join(f"?s{i} ?p{i} ?o{i} ." for i in range(15))
    endless = f"SELECT (COUNT(*) AS ?n) WHERE {{ GRAPH <{PUBLIC}> {{ {patterns} }} }}"

    async def test(client: SecureClient) -> None:
        viewer = await credentials(client, "viewer")
        stolen, hogging = await client.token(viewer), await client.token(viewer)
        writer = await client.login("writer")
        rows = " ".join(f"<{EX}s{i}> <{EX}p> {i} ." for i in range(300))
        assert (await client.update(writer, f"INSERT DATA {{ GRAPH <{PUBLIC}> {{ {rows} }} }}"))[0] == 200
        ws = await client.socket()
        hog = asyncio.create_task(client.query(hogging, endless))  # the client's one turn, for 2 s
        await asyncio.to_thread(wait_until, lambda: scheduler.in_flight == 1)
        await ws.send_json({"subscribe": {"sparql": WATCHED, "alias": "late", "authorization": f"Bearer {stolen}"}})
        await asyncio.to_thread(wait_until, lambda: scheduler.shares.waits == 1)  # authenticated, behind the hog
        await revoke(client, stolen)
        assert not hog.done()  # revoked while the subscribe still waits
        assert (await hog)[0] == 503
        ended = await receive(ws, timeout=FRAME_TIMEOUT_S)
        assert (ended.get("error"), ended.get("status_code"), ended.get("alias")) == ("invalid_grant", 401, "late"), (
            ended
        )
        await set_dim(client, writer, 13)
        with pytest.raises(asyncio.TimeoutError):
            await receive(ws, timeout=1.5)
        await ws.close()

    run_secure(gateway, test)
    assert gateway.gateway.engine.subscription_count == 0


def test_subscribes_racing_a_revocation_all_end(gateway: InProcessGateway) -> None:
    """Subscribes with the token sent on four sockets before, while and after it is revoked: every
    one ends with a 401 frame (refused at its subscribe, refused as it was registered, or ended by
    the watch), and the engine holds none of them once the watch has run: an update written then
    notifies none of them."""

    async def test(client: SecureClient) -> None:
        stolen = await client.login("viewer")
        writer = await client.login("writer")
        sockets = [await client.socket() for _ in range(4)]
        sent = 0

        async def send(ws: aiohttp.ClientWebSocketResponse, count: int) -> None:
            nonlocal sent
            for _ in range(count):
                alias = f"s{sent}"
                sent += 1
                await ws.send_json({"subscribe": {"sparql": WATCHED, "alias": alias, "authorization": stolen}})
                await asyncio.sleep(0.002)

        before = [asyncio.create_task(send(ws, 25)) for ws in sockets]
        await asyncio.sleep(0.03)
        await revoke(client, stolen)
        await asyncio.gather(*before)
        await send(sockets[0], 5)  # after: refused at once
        engine = gateway.gateway.engine
        await asyncio.to_thread(wait_until, lambda: engine.subscription_count == 0, FRAME_TIMEOUT_S)
        await set_dim(client, writer, 14)
        outcome: dict[str, list[str]] = {}
        for ws in sockets:
            while True:
                try:
                    reply: dict[str, Any] = await receive(ws, timeout=3.0)
                except TimeoutError:
                    break
                alias = reply.get("alias") or reply.get("notification", {}).get("alias")
                kind = reply.get("error") or f"notification {reply['notification']['sequence']}"
                outcome.setdefault(str(alias), []).append(kind)
        assert sorted(outcome) == sorted(f"s{i}" for i in range(sent)), outcome
        for alias, kinds in outcome.items():
            assert kinds[-1] == "invalid_grant", (alias, kinds)
            assert "notification 1" not in kinds, (alias, kinds)
        assert gateway.gateway.engine.subscription_count == 0
        for ws in sockets:
            await ws.close()

    run_secure(gateway, test)


def test_a_thousand_subscriptions_of_one_token_end_together_and_the_others_on_the_socket_go_on(
    gateway: InProcessGateway,
) -> None:
    """1,000 subscriptions made with one token on one socket, beside one made with another token of
    the same client: the revocation ends the 1,000 (1,000 frames, each naming its spuid) and leaves
    the other, which is then notified."""
    count = 1000

    async def test(client: SecureClient) -> None:
        viewer = await credentials(client, "viewer")
        stolen, kept = await client.token(viewer), await client.token(viewer)
        writer = await client.login("writer")
        ws = await client.socket()
        owner = await subscribe(ws, kept, "owner")
        for i in range(count):  # sent at once, read after: the socket's turns keep them in order
            await ws.send_json({"subscribe": {"sparql": WATCHED, "alias": f"t{i}", "authorization": stolen}})
        spuids = set()
        for _ in range(count):
            reply = await receive(ws, timeout=FRAME_TIMEOUT_S * 4)
            assert reply.get("notification", {}).get("sequence") == 0, reply
            spuids.add(reply["notification"]["spuid"])
        assert gateway.gateway.engine.subscription_count == count + 1
        started = time.monotonic()
        await revoke(client, stolen)
        ended = set()
        for _ in range(count):
            reply = await receive(ws, timeout=FRAME_TIMEOUT_S)
            assert (reply.get("error"), reply.get("status_code")) == ("invalid_grant", 401), reply
            ended.add(reply["spuid"])
        took = time.monotonic() - started
        assert ended == spuids
        assert gateway.gateway.engine.subscription_count == 1
        await set_dim(client, writer, 15)
        await added(ws, owner, 15)
        assert await revoked_count(client, gateway) == count
        print(f"{count} subscriptions ended {took:.2f} s after the revocation was sent")
        await ws.close()

    run_secure(gateway, test)


def test_past_the_bound_of_revocations_the_subscriptions_of_every_token_issued_until_then_end(
    gateway: InProcessGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cut-off path: past REVOKED_PER_CLIENT revoked tokens, every token of the client issued
    until then is refused, and the subscriptions made with any of them end too (here with a token
    never revoked by its jti); one made with a token issued after the cut-off goes on."""
    monkeypatch.setattr(tokens, "REVOKED_PER_CLIENT", 3)

    async def test(client: SecureClient) -> None:
        viewer = await credentials(client, "viewer")
        covered = await client.token(viewer)
        writer = await client.login("writer")
        ws = await client.socket()
        spuid = await subscribe(ws, covered, "covered")
        for _ in range(tokens.REVOKED_PER_CLIENT + 1):
            await revoke(client, await client.token(viewer))
        ended = await receive(ws, timeout=FRAME_TIMEOUT_S)
        assert (ended.get("error"), ended.get("spuid")) == ("invalid_grant", spuid), ended
        await asyncio.sleep(1.1)  # a token issued in the cut-off's second is covered by it
        later = await subscribe(ws, await client.token(viewer), "later")
        await asyncio.sleep(2.5)  # two turns of the watch
        await set_dim(client, writer, 16)
        await added(ws, later, 16)
        await ws.close()

    run_secure(gateway, test)


# -- delayed updates (broker.delayed, "Revoked tokens") ----------------------------------------------

# how far ahead the updates of the revocation tests are due: the revocation is sent at once, and
# must be answered before, which takes milliseconds; generous for a loaded CI machine
DUE_S = 5.0


def planted(name: str) -> str:
    return f"INSERT DATA {{ GRAPH <{PUBLIC}> {{ <{EX}{name}> <{EX}ran> true }} }}"


async def ran(client: SecureClient, admin: str) -> set[str]:
    """The names of the `planted` updates that ran."""
    rows = await client.rows(admin, f"SELECT ?s WHERE {{ GRAPH <{PUBLIC}> {{ ?s <{EX}ran> true }} }}")
    return {row[0][1].removeprefix(EX) for row in rows}


async def schedule(client: SecureClient, token: str, name: str, delay: str) -> tuple[str, float]:
    """Schedule `planted(name)` with `token`, `delay` ahead; its id and due time (Unix seconds)."""
    status, reply = await client.update(token, planted(name), delay=delay)
    assert status == 202, reply
    due = datetime.fromisoformat(reply["scheduled"]["due"]).timestamp()
    return str(reply["scheduled"]["id"]), due


async def listed(client: SecureClient, token: str) -> list[str]:
    """The ids GET /secure/scheduled shows the client of `token`."""
    url, headers = f"{client.https_url}/secure/scheduled", {"Authorization": f"Bearer {token}"}
    async with client.session.get(url, headers=headers, ssl=client.ssl) as reply:
        assert reply.status == 200
        return [entry["id"] for entry in (await reply.json())["scheduled"]]


async def metric(client: SecureClient, gateway: InProcessGateway, name: str) -> float:
    async with client.session.get(f"{gateway.http_url}/metrics") as reply:
        for line in (await reply.text()).splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return float(value)
    raise AssertionError(f"{name} is not on /metrics")


def test_the_delayed_updates_of_a_revoked_token_never_run_and_the_clients_others_do(
    gateway: InProcessGateway,
) -> None:
    """A thief's delayed updates, one due seconds after the revocation and one in ten minutes, are
    dropped by the revocation (no longer listed, counted); the same client's updates made with
    another token run, and so does one made with a token that expired before it fell due."""

    async def test(client: SecureClient) -> None:
        writer = await credentials(client, "writer")
        stolen, kept = await client.token(writer), await client.token(writer)
        admin = await client.login("admin")
        authority = gateway.gateway.secure.authority  # type: ignore[union-attr]
        # a token of ours with DUE_S of its life left: it expires before its update falls due
        expiring, _ = authority.tokens.issue(writer.client_id, now=time.time() - authority.tokens.lifetime_s + DUE_S)
        await schedule(client, expiring, "expired", f"PT{2 * DUE_S}S")
        await schedule(client, kept, "kept", f"PT{DUE_S}S")
        later, _ = await schedule(client, stolen, "later", "PT10M")
        soon, due = await schedule(client, stolen, "soon", f"PT{DUE_S}S")  # the last before the revocation
        await revoke(client, stolen)
        answered = time.time()
        assert answered < due, f"the revocation was answered {answered - due:.1f} s after the update fell due"
        assert not {soon, later} & set(await listed(client, kept))
        give_up = time.monotonic() + FRAME_TIMEOUT_S
        while not {"kept", "expired"} <= await ran(client, admin) and time.monotonic() < give_up:
            await asyncio.sleep(0.2)
        await asyncio.sleep(max(0.0, due + 1.0 - time.time()))
        assert await ran(client, admin) == {"kept", "expired"}
        assert await metric(client, gateway, "sepa_delayed_revoked_total") == 2
        assert await metric(client, gateway, "sepa_delayed_pending") == 0

    run_secure(gateway, test)


def test_past_the_bound_of_revocations_the_delayed_updates_of_every_token_issued_until_then_are_dropped(
    gateway: InProcessGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cut-off path: an update scheduled with a token never revoked by its jti is dropped when
    the client's cut-off covers that token; one scheduled with a token issued after stays."""
    monkeypatch.setattr(tokens, "REVOKED_PER_CLIENT", 3)

    async def test(client: SecureClient) -> None:
        writer = await credentials(client, "writer")
        covered = await client.token(writer)
        await schedule(client, covered, "covered", "PT10M")
        for _ in range(tokens.REVOKED_PER_CLIENT + 1):
            await revoke(client, await client.token(writer))
        assert await metric(client, gateway, "sepa_delayed_revoked_total") == 1
        await asyncio.sleep(1.1)  # a token issued in the cut-off's second is covered by it
        fresh = await client.token(writer)
        after, _ = await schedule(client, fresh, "after", "PT10M")
        assert await listed(client, fresh) == [after]

    run_secure(gateway, test)


def test_a_restart_after_the_revocation_does_not_bring_the_tokens_delayed_updates_back(tmp_path: Path) -> None:
    """The pending table is on disk. The revoked token's update, due after the restart, must not
    run then; the other token's does."""

    async def before(client: SecureClient) -> None:
        writer = await credentials(client, "writer")
        stolen, kept = await client.token(writer), await client.token(writer)
        # due after the restart, if it is quick; overdue ones run as it starts, which is the same test
        await schedule(client, kept, "kept", f"PT{2 * DUE_S}S")
        await schedule(client, stolen, "stolen", f"PT{2 * DUE_S}S")
        await revoke(client, stolen)

    async def after(client: SecureClient) -> None:
        admin = await client.login("admin")
        give_up = time.monotonic() + FRAME_TIMEOUT_S
        while "kept" not in await ran(client, admin) and time.monotonic() < give_up:
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # both were due at the same time
        assert await ran(client, admin) == {"kept"}

    run_started(tmp_path / "data", before)
    run_started(tmp_path / "data", after)


# -- revocations kept across a restart (broker.security.revocations) ---------------------------------


async def refused_everywhere(client: SecureClient, token: str) -> None:
    """`token` gets 401 invalid_grant on query, update and WSS subscribe."""
    status, reply = await client.query(token, WATCHED)
    assert (status, reply.get("error")) == (401, "invalid_grant"), reply
    status, reply = await client.update(token, planted("thief"))
    assert (status, reply.get("error")) == (401, "invalid_grant"), reply
    ws = await client.socket()
    await ws.send_json({"subscribe": {"sparql": WATCHED, "alias": "thief", "authorization": f"Bearer {token}"}})
    reply = await receive(ws, timeout=FRAME_TIMEOUT_S)
    assert (reply.get("error"), reply.get("status_code"), reply.get("alias")) == ("invalid_grant", 401, "thief")
    await ws.close()


async def served_everywhere(client: SecureClient, token: str, value: int) -> None:
    """`token` subscribes, updates (dim := `value`) and queries."""
    ws = await client.socket()
    await subscribe(ws, token, "owner")
    await set_dim(client, token, value)
    assert (await client.rows(token, WATCHED)) == {(("o", str(value)),)}
    await ws.close()


def test_a_revoked_token_stays_revoked_after_a_restart_and_the_clients_other_tokens_work(tmp_path: Path) -> None:
    """A token revoked (a thief's copy), the gateway restarted over the same data directory (a power
    cut, an upgrade): the token gets 401 on query, update and WSS subscribe, the client's other
    token (issued before the revocation) and a new one are served. Before, the revocation was kept
    in memory only and the stolen token was good again until its expiry."""
    held: dict[str, Any] = {}

    async def before(client: SecureClient) -> None:
        writer = await credentials(client, "writer")
        held["stolen"], held["kept"] = await client.token(writer), await client.token(writer)
        held["writer"] = writer
        await revoke(client, held["stolen"])
        await refused_everywhere(client, held["stolen"])

    async def after(client: SecureClient) -> None:
        await refused_everywhere(client, held["stolen"])
        await served_everywhere(client, held["kept"], 21)
        await served_everywhere(client, await client.token(held["writer"]), 22)

    run_started(tmp_path / "data", before)
    run_started(tmp_path / "data", after)


def test_the_cut_off_survives_a_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past REVOKED_PER_CLIENT revocations, a token never revoked by its jti but issued before the
    cut-off is refused after a restart too; one issued after the restart is served."""
    monkeypatch.setattr(tokens, "REVOKED_PER_CLIENT", 3)
    held: dict[str, Any] = {}

    async def before(client: SecureClient) -> None:
        writer = await credentials(client, "writer")
        held["covered"], held["writer"] = await client.token(writer), writer
        for _ in range(tokens.REVOKED_PER_CLIENT + 1):
            await revoke(client, await client.token(writer))
        await refused_everywhere(client, held["covered"])

    async def after(client: SecureClient) -> None:
        await refused_everywhere(client, held["covered"])
        await asyncio.sleep(1.1)  # a token issued in the cut-off's second is covered by it
        await served_everywhere(client, await client.token(held["writer"]), 23)

    run_started(tmp_path / "data", before)
    run_started(tmp_path / "data", after)


@pytest.mark.parametrize(
    "damage",
    [b"\x00" * 64, b'{"sub": "x", "jti"', b"garbage\n", b"\xff\xfe\n"],
    ids=["zeros", "torn-line", "garbage", "not-utf8"],
)
def test_a_damaged_revocation_file_at_start_refuses_every_token_issued_before_it(
    tmp_path: Path, damage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever the damage (zeros a power cut left, a torn line, garbage, bytes not UTF-8), the
    gateway starts, warns naming the file, and refuses every token issued before the start, revoked
    or not (which lines were lost is unknown); a token issued after it is served, and so is one
    after the next start, the file rewritten clean."""
    held: dict[str, Any] = {}
    path = tmp_path / "data" / "security" / revocations.REVOCATIONS_FILE

    async def before(client: SecureClient) -> None:
        writer = await credentials(client, "writer")
        held["never_revoked"], held["writer"] = await client.token(writer), writer
        await revoke(client, await client.token(writer))

    async def after(client: SecureClient) -> None:
        await refused_everywhere(client, held["never_revoked"])
        await asyncio.sleep(1.1)  # a token issued in the start's second is covered
        held["fresh"] = await client.token(held["writer"])
        await served_everywhere(client, held["fresh"], 24)

    async def again(client: SecureClient) -> None:
        await refused_everywhere(client, held["never_revoked"])
        await served_everywhere(client, held["fresh"], 25)

    run_started(tmp_path / "data", before)
    with path.open("ab") as file:
        file.write(damage)
    caplog.set_level(logging.WARNING, logger=revocations.__name__)
    run_started(tmp_path / "data", after)
    warned = [r for r in caplog.records if r.name == revocations.__name__ and "damaged" in r.getMessage()]
    assert [getattr(r, "path", None) for r in warned] == [str(path)]
    caplog.clear()
    run_started(tmp_path / "data", again)
    assert not [r for r in caplog.records if r.name == revocations.__name__]


def run_started(data_dir: Path, test: Callable[[SecureClient], Any]) -> None:
    """Start a secure gateway over `data_dir`, run `test` against it, stop it (a test that restarts one)."""
    endpoint, thread = start_in_process(secure_config(ADMIN, VIEWER, WRITER, data_dir=str(data_dir)))
    try:
        run_secure(endpoint, test)
    finally:
        stop_in_process(endpoint, thread)


def stop_in_process(endpoint: InProcessGateway, thread: threading.Thread) -> None:
    """Stop a gateway of start_in_process as the in_process_gateway fixture does (a test that restarts one)."""
    endpoint.call(endpoint.gateway.stop(), timeout=STOP_TIMEOUT_S)
    endpoint.loop.call_soon_threadsafe(endpoint.loop.stop)
    thread.join(STOP_TIMEOUT_S)
    endpoint.loop.close()
