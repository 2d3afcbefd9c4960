"""Failed authentications from one network address are rationed (broker/security/failures.py).

Found by an attack pass from one LAN address: 2,542 wrong client secrets a second answered at
/oauth/token, 1,357 forged ES256 bearer tokens a second checked on /secure/query, /secure/update and
WSS subscribe, 1,645 refused registrations a second, an honest client's p99 at 31-91 ms meanwhile,
and wrong secrets and refused registrations counted as one `unauthorized_client` series. Now an
address has `auth_failure_burst` failures (20), given back at `auth_failures_per_s`; past them 429
with Retry-After before any hash or signature check, and /metrics says why each attempt failed.
Real TLS sockets against `sepa-gateway run --secure`, the attacker on this machine's LAN address,
the honest client on loopback (this board's, not limited) or on a second network address.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import socket
import ssl
import time
from pathlib import Path
from typing import Any

import aiohttp
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from broker.security.failures import LOG_EVERY_S, FailureBudget, TooManyFailures
from tests.support.coap import host_address

ADMIN = '[[security.clients]]\nidentity = "admin"\nread = ["*"]\nwrite = ["*"]\n'
VIEWER = '[[security.clients]]\nidentity = "viewer"\nread = ["*"]\n'
BURST = 20
# one failure given back every 2 s: the burst is spent long before a token comes back, on any machine
PER_S = 0.5
REASONS = ("bad_token", "rate_limited", "registration_refused", "wrong_secret")


# -- the bucket alone ----------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_then_the_refill_rate_per_address_and_this_board_not_at_all() -> None:
    clock = Clock()
    budget = FailureBudget(20, 2.0, clock=clock)
    for _ in range(20):
        budget.take("192.0.2.7")  # 20 failures (taken, never given back)
    with pytest.raises(TooManyFailures) as refused:
        budget.take("192.0.2.7")
    assert refused.value.retry_after_s == 1 and refused.value.headers == {"Retry-After": "1"}
    budget.take("192.0.2.8")  # another address: its own burst
    for _ in range(100):
        budget.take(None)  # this board: never refused, never in the table
    clock.now += 0.5  # one failure back at 2 a second
    budget.take("192.0.2.7")
    with pytest.raises(TooManyFailures):
        budget.take("192.0.2.7")
    assert budget.throttled() == 1 and len(budget) == 2


def test_a_success_costs_nothing_and_refunds_nothing_more() -> None:
    clock = Clock()
    budget = FailureBudget(3, 1.0, clock=clock)
    for _ in range(100):  # successes: taken and given back
        budget.take("192.0.2.7")
        budget.give_back("192.0.2.7")
    assert len(budget) == 0  # an address that owes nothing takes no room
    for _ in range(3):
        budget.take("192.0.2.7")
    budget.give_back("192.0.2.7")  # the last attempt succeeded: its own token back, no more
    budget.take("192.0.2.7")
    with pytest.raises(TooManyFailures) as refused:
        budget.take("192.0.2.7")
    assert refused.value.retry_after_s == 1


def test_many_addresses_take_bounded_room_and_refusals_are_logged_once_a_minute_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    budget = FailureBudget(1, 0.01, max_addresses=64, clock=clock)
    for number in range(10_000):
        budget.take(f"10.0.{number // 256}.{number % 256}")
    assert len(budget) == 64  # the least recently seen evicted
    caplog.set_level(logging.WARNING, logger="broker.security.failures")
    for _ in range(50):
        with pytest.raises(TooManyFailures):
            budget.take("10.0.39.15")  # the last one: still in the table, still owing
    clock.now += LOG_EVERY_S
    with pytest.raises(TooManyFailures):
        budget.take("10.0.39.15")
    lines = [record for record in caplog.records if record.name == "broker.security.failures"]
    assert [(line.peer, line.refused) for line in lines] == [("10.0.39.15", 1), ("10.0.39.15", 50)]


# -- over real sockets ---------------------------------------------------------------------------


def secure_toml(lan: str, *clients: str) -> str:
    return (
        f'[security]\nhost = "{"::" if ":" in lan else "0.0.0.0"}"\n'
        f"auth_failure_burst = {BURST}\nauth_failures_per_s = {PER_S}\n" + "".join(clients)
    )


class Client:
    """Raw HTTPS and WSS requests to the gateway from one source address."""

    def __init__(self, session: aiohttp.ClientSession, https: str, wss: str, context: ssl.SSLContext) -> None:
        self.session, self.https, self.wss, self.ssl = session, https, wss, context

    async def token(self, client_id: str, secret: str) -> tuple[int, dict[str, str], dict[str, Any]]:
        basic = "Basic " + base64.b64encode(f"{client_id}:{secret}".encode()).decode()
        url = f"{self.https}/oauth/token"
        async with self.session.post(url, headers={"Authorization": basic}, ssl=self.ssl) as reply:
            return reply.status, dict(reply.headers), await reply.json(content_type=None)

    async def register(self, identity: str) -> tuple[int, dict[str, str], dict[str, Any]]:
        body = {"register": {"client_identity": identity, "grant_types": ["client_credentials"]}}
        async with self.session.post(f"{self.https}/oauth/register", json=body, ssl=self.ssl) as reply:
            return reply.status, dict(reply.headers), await reply.json(content_type=None)

    async def query(self, token: str) -> tuple[int, dict[str, str], dict[str, Any]]:
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/sparql-results+json"}
        url = f"{self.https}/secure/query"
        async with self.session.get(url, params={"query": "ASK {}"}, headers=headers, ssl=self.ssl) as reply:
            return reply.status, dict(reply.headers), await reply.json(content_type=None)

    async def revoke(self, token: str) -> tuple[int, dict[str, str]]:
        url = f"{self.https}/oauth/revoke"
        async with self.session.post(url, data={"token": token}, ssl=self.ssl) as reply:
            await reply.read()
            return reply.status, dict(reply.headers)

    async def subscribe(self, token: str) -> dict[str, Any]:
        async with self.session.ws_connect(f"{self.wss}/secure/subscribe", ssl=self.ssl) as ws:
            await ws.send_str(
                json.dumps(
                    {"subscribe": {"sparql": "SELECT * WHERE { ?s ?p ?o }", "alias": "a", "authorization": token}}
                )
            )
            message = await ws.receive(timeout=10)
            assert message.type == aiohttp.WSMsgType.TEXT, message
            return dict(json.loads(message.data))


def url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


async def clients(gateway: Any, data_dir: Path, sources: list[str | None]) -> list[Client]:
    """One client per source address (None: loopback), each on a session of its own."""
    context = ssl.create_default_context(cafile=str(data_dir / "security" / "tls-cert.pem"))
    context.check_hostname = False  # the certificate is pinned; the addresses it names are not under test
    https_port, wss_port = gateway.https_url.rpartition(":")[2], gateway.wss_url.rpartition(":")[2]
    made = []
    for source in sources:
        if source is None:
            host, connector = "127.0.0.1", aiohttp.TCPConnector()
        else:
            family = socket.AF_INET6 if ":" in source else socket.AF_INET
            host, connector = source, aiohttp.TCPConnector(local_addr=(source, 0), family=family)
        session = aiohttp.ClientSession(connector=connector)
        made.append(
            Client(session, f"https://{url_host(host)}:{https_port}", f"wss://{url_host(host)}:{wss_port}", context)
        )
    return made


async def close(made: list[Client]) -> None:
    for client in made:
        await client.session.close()


def failures(gateway: Any) -> dict[str, float]:
    metrics = gateway.metrics()
    return {reason: metrics[f'sepa_security_auth_failures_total{{reason="{reason}"}}'] for reason in REASONS}


def retry_after(headers: dict[str, str]) -> int:
    value = int(headers["Retry-After"])
    assert value >= 1
    return value


@pytest.fixture
def attacked(start_gateway: Any, tmp_path: Path) -> tuple[Any, Path, str]:
    """A secure gateway knowing the admin and the viewer, its data directory, and this machine's
    LAN address, the attacker's."""
    lan = host_address()
    data = tmp_path / "data"
    return start_gateway("--secure", toml=secure_toml(lan, ADMIN, VIEWER), data_dir=data), data, lan


def test_wrong_secrets_past_the_burst_are_429_and_other_clients_get_their_tokens_at_once(
    attacked: tuple[Any, Path, str], caplog: pytest.LogCaptureFixture
) -> None:
    gateway, data, lan = attacked

    async def main() -> None:
        attacker, board = await clients(gateway, data, [lan, None])
        try:
            _, _, viewer = await board.register("viewer")
            _, _, admin = await board.register("admin")
            viewer_id, viewer_secret = viewer["credentials"]["client_id"], viewer["credentials"]["client_secret"]
            for attempt in range(BURST):
                status, _, reply = await attacker.token(viewer_id, f"guess{attempt}")
                assert (status, reply["error"]) == (401, "unauthorized_client"), (attempt, reply)
            status, headers, reply = await attacker.token(viewer_id, "guess-past-the-burst")
            assert (status, reply["error"], reply["status_code"]) == (429, "too_many_requests", 429), reply
            wait = retry_after(headers)
            assert "Basic" not in reply["error_description"] and "guess" not in reply["error_description"]
            # the right secret from the throttled address: refused too, before its hash is computed
            status, headers, reply = await attacker.token(viewer_id, viewer_secret)
            assert status == 429 and retry_after(headers) <= wait, reply
            # this board, another client and the same one: their tokens at once
            started = time.monotonic()
            status, _, reply = await board.token(
                admin["credentials"]["client_id"], admin["credentials"]["client_secret"]
            )
            assert status == 201, reply
            assert (await board.token(viewer_id, viewer_secret))[0] == 201
            assert time.monotonic() - started < 1.0
            await asyncio.sleep(wait)
            status, _, reply = await attacker.token(viewer_id, viewer_secret)  # a failure given back
            assert status == 201, reply
        finally:
            await close([attacker, board])

    caplog.set_level(logging.WARNING)
    asyncio.run(main())
    assert failures(gateway) == {"wrong_secret": BURST, "rate_limited": 2, "registration_refused": 0, "bad_token": 0}
    metrics = gateway.metrics()
    assert metrics['sepa_errors_total{error="unauthorized_client",status="401"}'] == BURST  # as before
    assert metrics["sepa_security_auth_budget_addresses"] == 1
    assert gateway.stop() == 0
    log = gateway.log()
    assert log.count("too many failures from one address") == 1 and lan in log
    assert "guess" not in log


def test_refused_registrations_past_the_burst_are_429_and_counted_apart_from_wrong_secrets(
    attacked: tuple[Any, Path, str],
) -> None:
    gateway, data, lan = attacked

    async def main() -> None:
        attacker, board = await clients(gateway, data, [lan, None])
        try:
            for attempt in range(BURST):
                status, _, reply = await attacker.register(f"stranger{attempt}")
                assert (status, reply["error"]) == (401, "unauthorized_client"), reply
            status, headers, reply = await attacker.register("viewer")  # allowed, but from a throttled address
            assert (status, reply["error"]) == (429, "too_many_requests") and retry_after(headers) >= 1
            assert (await board.register("viewer"))[0] == 201
        finally:
            await close([attacker, board])

    asyncio.run(main())
    assert failures(gateway) == {"wrong_secret": 0, "rate_limited": 1, "registration_refused": BURST, "bad_token": 0}
    assert gateway.metrics()["sepa_security_registrations_refused_total"] == BURST


def forged(client_id: str) -> str:
    """A well-formed ES256 token for a registered client, signed with a key that is not the gateway's."""
    now = int(time.time())
    claims = {"iss": "sepa-gateway:x", "sub": client_id, "iat": now, "exp": now + 600, "jti": str(time.monotonic())}
    return jwt.encode(claims, ec.generate_private_key(ec.SECP256R1()), algorithm="ES256")


def test_forged_bearer_tokens_past_the_burst_are_429_on_https_and_wss_and_verified_tokens_still_pass(
    attacked: tuple[Any, Path, str],
) -> None:
    gateway, data, lan = attacked

    async def main() -> None:
        attacker, board = await clients(gateway, data, [lan, None])
        try:
            _, _, admin = await board.register("admin")
            credentials = admin["credentials"]["client_id"], admin["credentials"]["client_secret"]
            used = (await board.token(*credentials))[2]["access_token"]
            assert (await attacker.query(used))[0] == 200  # verified once: the gateway has it
            fresh = (await board.token(*credentials))[2]["access_token"]
            for attempt in range(BURST):
                status, _, reply = await attacker.query(forged(credentials[0]))
                assert (status, reply["error"]) == (401, "invalid_grant"), (attempt, reply)
            status, headers, reply = await attacker.query(forged(credentials[0]))
            assert (status, reply["error"]) == (429, "too_many_requests"), reply
            retry_after(headers)
            # a token not yet verified costs a signature check: refused from the throttled address...
            assert (await attacker.query(fresh))[0] == 429
            # ...and served at once to another client; the token the gateway verified before is
            # only looked up, from any address
            assert (await board.query(fresh))[0] == 200
            assert (await attacker.query(used))[0] == 200
            # the same budget on the WSS port: a frame, Retry-After in its body
            frame = await attacker.subscribe(forged(credentials[0]))
            assert (frame["error"], frame["status_code"], frame["alias"]) == ("too_many_requests", 429, "a"), frame
            assert frame["retry_after"] >= 1
            assert "notification" in await attacker.subscribe(used)
            # /oauth/revoke checks the signature of what it names: the same budget
            status, headers = await attacker.revoke(forged(credentials[0]))
            assert status == 429 and retry_after(headers) >= 1
            assert (await board.revoke(forged(credentials[0])))[0] == 200  # RFC 7009: 200 whatever it names
        finally:
            await close([attacker, board])

    asyncio.run(main())
    # the board's forged revocation is counted too, though this board's attempts are not rationed
    expected = {"wrong_secret": 0, "rate_limited": 4, "registration_refused": 0, "bad_token": BURST + 1}
    assert failures(gateway) == expected


def ipv6_sources() -> list[str]:
    """This machine's IPv6 addresses off loopback: global ones, then link-local ones as ``addr%if``
    (a link-local source reaches the machine's own global address too)."""
    try:
        lines = Path("/proc/net/if_inet6").read_text(encoding="ascii").splitlines()
    except OSError:
        return []
    found: list[tuple[int, str]] = []
    for line in lines:
        raw, _, _, scope, _, interface = line.split()[:6]
        address = socket.inet_ntop(socket.AF_INET6, bytes.fromhex(raw))
        if scope == "00":
            found.append((0, address))
        elif scope == "20":
            found.append((1, f"{address}%{interface}"))
    return [address for _, address in sorted(found)]


def test_another_network_address_is_not_held_by_an_attacking_one(start_gateway, tmp_path: Path) -> None:
    """Two network addresses of this machine (IPv6: the gateway listens on `::`): the second gets its
    token at once while the first is throttled; only the first is in the table."""
    sources = ipv6_sources()
    if len(sources) < 2 or "%" in sources[0]:
        pytest.skip("this machine has no two IPv6 addresses off loopback, one of them global")
    attacker_address, other_address = sources[:2]
    data = tmp_path / "data"
    gateway = start_gateway("--secure", toml=secure_toml("::", ADMIN, VIEWER), data_dir=data)

    async def main() -> None:
        (loopback,) = await clients(gateway, data, [None])
        https_port = gateway.https_url.rpartition(":")[2]
        url = f"https://[{attacker_address}]:{https_port}"
        board = Client(loopback.session, f"https://[::1]:{https_port}", "", loopback.ssl)  # `::` is IPv6 only
        made = [board]
        for source in (attacker_address, other_address):
            address, _, interface = source.partition("%")
            scope = socket.if_nametoindex(interface) if interface else 0
            connector = aiohttp.TCPConnector(local_addr=(address, 0, 0, scope), family=socket.AF_INET6)  # type: ignore[arg-type]
            made.append(Client(aiohttp.ClientSession(connector=connector), url, "", board.ssl))
        _, attacker, other = made
        try:
            _, _, viewer = await board.register("viewer")
            viewer_id, viewer_secret = viewer["credentials"]["client_id"], viewer["credentials"]["client_secret"]
            for attempt in range(BURST):
                assert (await attacker.token(viewer_id, f"guess{attempt}"))[0] == 401
            assert (await attacker.token(viewer_id, viewer_secret))[0] == 429
            started = time.monotonic()
            assert (await other.token(viewer_id, viewer_secret))[0] == 201
            assert time.monotonic() - started < 1.0
        finally:
            await close(made)

    asyncio.run(main())
    metrics = gateway.metrics()
    assert metrics["sepa_security_auth_budget_addresses"] == 1
    assert metrics['sepa_security_auth_failures_total{reason="wrong_secret"}'] == BURST
