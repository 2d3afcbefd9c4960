"""What a web page the user opens can do to the gateway: CORS only for listed origins, no
state-changing request nor WebSocket from another origin, and nothing at all, not even a read, from
a page under a DNS name rebound to the gateway's address (see broker/gates/dispatch.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
from collections import Counter
from urllib.parse import quote, urlsplit

import aiohttp
import pytest

from broker.gates.dispatch import HOSTS_CACHED, Dispatcher, Routes
from gateway.appliance.config import Config
from tests.broker.gates.secure_support import SecureClient, secure_config
from tests.broker.gates.test_secure_gates import run_secure
from tools.launcher import InProcessGateway, RunningGateway

DASHBOARD = "http://dashboard.example:8080"
EVIL = "http://evil.example"
EX = "http://example.org/origin/"


ALLOWED = "gw.plant.example"  # [http] allowed_hosts
SECRET = "http://example.org/origin/secret"


@pytest.fixture
def gateway(in_process_gateway) -> InProcessGateway:
    config = Config()
    config.http.cors_origins = [DASHBOARD]
    config.http.allowed_hosts = [ALLOWED]
    return in_process_gateway(config)


def count(gateway: InProcessGateway, name: str) -> int:
    return len(gateway.select(f"SELECT * WHERE {{ <{EX}{name}> ?p ?o }}"))


async def post_form(session: aiohttp.ClientSession, url: str, name: str, headers: dict[str, str]) -> int:
    data = {"update": f"INSERT DATA {{ <{EX}{name}> <{EX}p> 1 }}"}
    async with session.post(url, data=data, headers=headers) as reply:
        return reply.status


def test_cors_headers_name_a_listed_origin_only(gateway: InProcessGateway) -> None:
    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            url = f"{gateway.http_url}/query?query=ASK%7B%7D"
            async with session.get(url, headers={"Origin": DASHBOARD}) as reply:
                assert reply.headers["Access-Control-Allow-Origin"] == DASHBOARD
                assert "Origin" in reply.headers["Vary"]
            async with session.get(url, headers={"Origin": EVIL}) as reply:
                assert reply.status == 200 and "Access-Control-Allow-Origin" not in reply.headers
            preflight = {"Origin": DASHBOARD, "Access-Control-Request-Method": "POST"}
            async with session.options(f"{gateway.http_url}/update", headers=preflight) as reply:
                assert reply.status == 204 and reply.headers["Access-Control-Allow-Origin"] == DASHBOARD
                assert "POST" in reply.headers["Access-Control-Allow-Methods"]
            async with session.options(f"{gateway.http_url}/update", headers={**preflight, "Origin": EVIL}) as reply:
                assert "Access-Control-Allow-Origin" not in reply.headers

    asyncio.run(main())


def test_cross_origin_writes_are_refused_and_change_nothing(gateway: InProcessGateway) -> None:
    update = f"{gateway.http_url}/update"
    port = urlsplit(gateway.http_url).port

    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            assert await post_form(session, update, "evil", {"Origin": EVIL}) == 403
            assert await post_form(session, update, "evil", {"Origin": "null"}) == 403
            assert await post_form(session, update, "evil", {"Sec-Fetch-Site": "cross-site"}) == 403
            # DNS rebinding: same origin by name, but the name is not ours (the Host check refuses it first)
            rebound = {"Origin": f"http://evil.example:{port}", "Host": f"evil.example:{port}"}
            assert await post_form(session, update, "evil", rebound) == 421
            async with session.delete(f"{gateway.http_url}/scheduled/x", headers={"Origin": EVIL}) as reply:
                assert reply.status == 403
            assert await post_form(session, update, "listed", {"Origin": DASHBOARD}) == 200
            assert await post_form(session, update, "same", {"Origin": f"http://127.0.0.1:{port}"}) == 200
            assert await post_form(session, update, "plain", {}) == 200  # curl, SEPA clients: no Origin

    asyncio.run(main())
    assert count(gateway, "evil") == 0
    assert (count(gateway, "listed"), count(gateway, "same"), count(gateway, "plain")) == (1, 1, 1)
    metrics = gateway.request("GET", "/metrics").body.decode()
    assert 'sepa_errors_total{error="forbidden",status="403"} 4' in metrics
    assert 'sepa_errors_total{error="misdirected_request",status="421"} 1' in metrics


def test_a_foreign_page_cannot_open_a_subscription(gateway: InProcessGateway) -> None:
    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            for base in (gateway.http_url.replace("http", "ws"), gateway.ws_url):
                with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                    await session.ws_connect(f"{base}/subscribe", headers={"Origin": EVIL})
                assert refused.value.status == 403
                ws = await session.ws_connect(f"{base}/subscribe", headers={"Origin": DASHBOARD})
                await ws.send_json({"subscribe": {"sparql": "ASK {}"}})
                assert "notification" in json.loads((await ws.receive(timeout=10)).data)
                await ws.close()

    asyncio.run(main())


# -- DNS rebinding: the Host a request names --------------------------------------------------


def exchange(port: int, head: str) -> tuple[int, bytes]:
    """Send a request head (no body) on a fresh connection; the status and the reply (its head, and
    its body when it says its length: a refused upgrade keeps the connection open)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(head.encode())
        received = b""
        while chunk := connection.recv(65536):
            received += chunk
            reply_head, separator, body = received.partition(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in reply_head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                None,
            )
            if separator and (received.startswith(b"HTTP/1.1 101 ") or (length is not None and len(body) >= length)):
                break
    return int(received.split(b" ", 2)[1]), received


def get(port: int, path: str, host: str | None, version: str = "1.1") -> tuple[int, bytes]:
    lines = [f"GET {path} HTTP/{version}", "Connection: close"]
    if host is not None:
        lines.append(f"Host: {host}")
    return exchange(port, "\r\n".join(lines) + "\r\n\r\n")


def upgrade(port: int, host: str) -> int:
    return exchange(
        port,
        f"GET /subscribe HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )[0]


READ_ALL = "/query?query=" + quote("SELECT * WHERE { ?s ?p ?o }")


def test_a_page_under_a_rebound_dns_name_reads_nothing(gateway: InProcessGateway) -> None:
    """attacker.example resolved to 127.0.0.1: its page's fetch() carries no Origin, only its Host."""
    assert gateway.update(f"INSERT DATA {{ <{SECRET}> <{EX}p> 'the store' }}").status == 200
    port = gateway.http_port
    for path in (READ_ALL, "/metrics", "/spus", "/scheduled", "/health", "/", "/no-such-path"):
        for host in (
            f"attacker.example:{port}",
            "attacker.example",
            f"ATTACKER.example.:{port}",
            f"127.0.0.1.nip.io:{port}",
            f"localhost:{port}@attacker.example",
        ):
            status, reply = get(port, path, host)
            head, _, body = reply.partition(b"\r\n\r\n")
            assert status == 421, (path, host, reply[:300])
            assert json.loads(body) == {
                "error": "misdirected_request",
                "error_description": "this gateway does not serve the host name the request names; "
                "an operator can list it in [http] allowed_hosts",
                "status_code": 421,
            }
            assert b"secret" not in reply and b"Access-Control" not in head
    refused = {"Host": f"attacker.example:{port}"}
    assert gateway.request("HEAD", "/", headers=refused).status == 421
    update = {"Host": f"attacker.example:{port}", "Content-Type": "application/sparql-update"}
    assert gateway.request("POST", "/update", f"INSERT DATA {{ <{EX}rebound> <{EX}p> 1 }}", update).status == 421
    expect = {**update, "Expect": "100-continue"}  # refused before the body is invited
    assert gateway.request("POST", "/update", f"INSERT DATA {{ <{EX}rebound> <{EX}p> 1 }}", expect).status == 421
    assert count(gateway, "rebound") == 0
    metrics = gateway.request("GET", "/metrics").body.decode()
    assert 'sepa_errors_total{error="misdirected_request",status="421"} 38' in metrics


def test_a_flood_of_cross_origin_writes_is_counted_and_logged_once_a_minute(
    gateway: InProcessGateway, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by an attack pass: each refused cross-origin request was a log line, a flood any host
    could write at its own pace. Every one is counted (403), the log gets one line a minute at most."""
    flood = 300
    caplog.set_level(logging.INFO, logger="broker.gates.dispatch")

    async def main() -> list[int]:
        async with aiohttp.ClientSession() as session:
            url = f"{gateway.http_url}/update"
            return await asyncio.gather(
                *(post_form(session, url, "evil", {"Origin": f"{EVIL}{number}"}) for number in range(flood))
            )

    assert asyncio.run(main()) == [403] * flood
    logged = [record for record in caplog.records if record.getMessage() == "cross-origin request refused"]
    assert len(logged) == 1 and logged[0].refused == 1 and logged[0].origin.startswith(EVIL), logged
    assert gateway.metrics()['sepa_errors_total{error="forbidden",status="403"}'] == flood
    assert count(gateway, "evil") == 0


def test_our_own_names_and_the_allowed_ones_are_served(gateway: InProcessGateway) -> None:
    assert gateway.update(f"INSERT DATA {{ <{SECRET}> <{EX}p> 'the store' }}").status == 200
    port = gateway.http_port
    own = socket.gethostname()
    for host in (
        f"127.0.0.1:{port}",
        "127.0.0.1",
        f"localhost:{port}",
        f"LocalHost.:{port}",
        f"[::1]:{port}",
        "[::1]",
        f"10.1.2.3:{port}",
        f"{own}:{port}",
        f"{own.upper()}.local:{port}",
        f"{ALLOWED}:{port}",
        f"GW.Plant.Example.:{port}",
    ):
        status, reply = get(port, READ_ALL, host)
        assert status == 200 and SECRET.encode() in reply, (host, reply[:300])
        assert get(port, "/", host)[0] == 200  # the dashboard
    status, reply = get(port, READ_ALL, None, version="1.0")  # HTTP/1.0 without Host
    assert status == 200 and SECRET.encode() in reply, reply[:300]
    # the allowed name counts as ours for the origin policy too: the dashboard's own writes under it
    origin = {"Origin": f"http://{ALLOWED}:{port}", "Host": f"{ALLOWED}:{port}"}
    assert (
        gateway.request(
            "POST",
            "/update",
            f"INSERT DATA {{ <{EX}allowed> <{EX}p> 1 }}",
            {**origin, "Content-Type": "application/sparql-update"},
        ).status
        == 200
    )
    assert count(gateway, "allowed") == 1


def test_a_websocket_upgrade_under_a_foreign_name_is_refused(gateway: InProcessGateway) -> None:
    for port in (gateway.http_port, gateway.ws_port):
        assert upgrade(port, f"attacker.example:{port}") == 421
        assert upgrade(port, f"127.0.0.1:{port}") == 101
        assert upgrade(port, f"{ALLOWED}:{port}") == 101


def test_the_decisions_kept_are_bounded() -> None:
    """Names that change with every request (a scan, a flood) cost memory HOSTS_CACHED entries at most."""
    dispatcher = Dispatcher(Routes(), Counter(), max_request_bytes=1000, allowed_hosts=["GW.example."])
    assert dispatcher.ours("gw.example:80") and dispatcher.ours("[::1]:8000") and dispatcher.ours("localhost")
    for number in range(3 * HOSTS_CACHED):
        assert not dispatcher.ours(f"n{number}.attacker.example:8000")
        assert len(dispatcher._hosts) <= HOSTS_CACHED
    assert dispatcher.ours("gw.example") and not dispatcher.ours("gw.example.attacker.example")


def test_a_host_that_is_not_a_host_is_not_ours() -> None:
    """`localhost:80@evil.example` was read by its part before the last colon, and so was ours."""
    dispatcher = Dispatcher(Routes(), Counter(), max_request_bytes=1000)
    for host in ("localhost:80@evil.example", "127.0.0.1:80/evil", "localhost:8000:80", "local host", "[::1]x:80"):
        assert not dispatcher.ours(host), host
    for host in ("localhost", "localhost:8000", "127.0.0.1:", "[::1]:8000", "[fe80::1]", "LOCALHOST."):
        assert dispatcher.ours(host), host


def test_allowed_hosts_from_the_toml_file(start_gateway) -> None:
    """The setting as an operator writes it, in a `sepa-gateway run` subprocess; refusals are
    logged once a minute at most on each port, whatever their number."""
    gateway: RunningGateway = start_gateway(toml='[http]\nallowed_hosts = ["gw.plant.example", "gateway"]\n')
    port = gateway.http_port
    for host in ("gw.plant.example", "gateway", f"gateway:{port}"):
        assert get(port, "/query?query=ASK%7B%7D", host)[0] == 200, host
    for number in range(20):
        assert get(port, "/query?query=ASK%7B%7D", f"n{number}.attacker.example:{port}")[0] == 421
    assert upgrade(gateway.ws_port, "attacker.example") == 421
    assert upgrade(gateway.ws_port, "gw.plant.example") == 101
    assert gateway.metrics()['sepa_errors_total{error="misdirected_request",status="421"}'] == 21
    gateway.wait_for_line(re.compile("not ours.*path=/subscribe"), 10)  # stderr is read by a thread
    logged = [line for line in gateway.stderr_lines if "host name that is not ours" in line]
    assert len(logged) == 2, logged  # one a minute at most on each port
    assert "host=n0.attacker.example" in logged[0] and "path=/query refused=1" in logged[0], logged
    assert "host=attacker.example path=/subscribe refused=1" in logged[1], logged


def test_the_secure_gates_leave_the_name_to_tls(in_process_gateway, tmp_path) -> None:
    """The decision (docs/security.md, "DNS rebinding"): on the HTTPS port a browser sends nothing
    for attacker.example, whose name the gateway's certificate does not carry, so the gates there
    do not check Host, and names of an operator's certificate need no listing."""
    gateway = in_process_gateway(secure_config(data_dir=str(tmp_path / "data")))

    async def test(client: SecureClient) -> None:
        headers = {"Host": f"gw.plant.example:{urlsplit(client.https_url).port}"}
        async with client.session.get(client.https_url + "/", headers=headers, ssl=client.ssl) as reply:
            assert reply.status == 200  # the dashboard, a public page
        async with client.session.get(client.https_url + "/secure/metrics", headers=headers, ssl=client.ssl) as reply:
            assert reply.status == 401  # data needs a token, whatever the name

    run_secure(gateway, test)
    assert get(gateway.http_port, "/", f"gw.plant.example:{gateway.http_port}")[0] == 421


def test_the_secure_gates_take_https_and_their_own_host_as_same_origin(in_process_gateway, tmp_path) -> None:
    """The dashboard reached under a name of the certificate (not in allowed_hosts) logs in: its
    POST /oauth/token carries Origin https://<Host>, which over TLS only a page of that name sends
    (the tester's t3_session.py: 403 "cross-origin requests are refused"). Another origin is still refused."""
    gateway = in_process_gateway(secure_config(data_dir=str(tmp_path / "data")))

    async def test(client: SecureClient) -> None:
        port = urlsplit(client.https_url).port
        host = f"gw.plant.example:{port}"
        for origin, expected in (
            (f"https://{host}", 401),  # past the origin policy: the token endpoint wants credentials
            (f"https://GW.Plant.Example:{port}", 401),
            (f"http://{host}", 403),  # not what a page over TLS sends
            (f"https://evil.example:{port}", 403),
            (f"https://gw.plant.example:{port + 1}", 403),
            ("null", 403),
        ):
            headers = {"Host": host, "Origin": origin, "Authorization": "Basic eDp5"}
            async with client.session.post(client.https_url + "/oauth/token", headers=headers, ssl=client.ssl) as reply:
                assert reply.status == expected, (origin, reply.status, await reply.text())
        cross = {"Host": host, "Origin": f"https://{host}", "Sec-Fetch-Site": "cross-site"}
        async with client.session.post(client.https_url + "/oauth/token", headers=cross, ssl=client.ssl) as reply:
            assert reply.status == 403

    run_secure(gateway, test)
    # the plain port is as it was: the name is not ours there
    assert get(gateway.http_port, "/", f"gw.plant.example:{gateway.http_port}")[0] == 421
