"""The SEPA project's JavaScript client, @arces-wot/sepa-js 0.13.2, unchanged, across a restart of
the gateway (tests/broker/gates/js/restart_client.js): the gateway's part that is best for it, and
the client's own crash that no gateway behaviour avoids (docs/protocol.md, "What clients should
know").

- Stopped (SIGTERM), the gateway closes every socket with 1001 "going away"; killed, the sockets
  just end (1006). Either way sepa-js reconnects every second until the gateway answers again on
  the same ports, subscribes again (sequence 0 once more) and is notified as before, plain and
  secure, also when the gateway is down for seconds.
- Two or more subscriptions on one of its sockets: each `subscribe` added a "close" listener of
  its own, so one lost socket starts as many reconnection loops; they make their sockets in the
  same timer tick, and the first to open sends on the last one made, still connecting: "WebSocket
  is not open: readyState 0" thrown from an event listener (lib/connection.js:21) ends the Node
  process. A killed gateway cannot keep its sockets, so nothing it does avoids that; one
  subscription per client object does.
- Secure, back after its token expired: sepa-js subscribes again with that token; the gateway
  refuses it (401) without charging the host's failure budget, and the client renews and resumes
  (25 clients of one host were throttled, and their Node process crashed on the 429 of a token
  renewal). Its dropped stream then doubles each notification: the client's doing.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.broker.gates.test_sepa_js_apps import JS, node_command
from tests.support.coap import host_address
from tools.launcher import HOST, RunningGateway, free_ports, launch_gateway

SUBJECT = "<http://example.org/js/lamp> <http://example.org/js/level>"
# generous: at load 10 a gateway took 15 s to serve (tools.launcher); the client retries every second
EVENT_TIMEOUT_S = 120.0


class Client:
    """restart_client.js running, its JSON lines read on a thread."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            argv, cwd=JS, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.events: list[dict[str, Any]] = []
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(json.loads(line))
        self._lines.put(None)

    def wait_until(self, done: Callable[[list[dict[str, Any]]], bool], what: str) -> None:
        """Until `done(every event so far)`; fails on the client's exit or an error event."""
        while not done(self.events):
            try:
                event = self._lines.get(timeout=EVENT_TIMEOUT_S)
            except queue.Empty:
                raise AssertionError(f"not {what} in {EVENT_TIMEOUT_S} s: {self.events}") from None
            exited = f"the client exited {self.process.poll()} before {what}"
            assert event is not None, (exited, self.events, self.stderr())
            assert event["step"] not in ("failed", "error", "connection-error"), (event, self.events)
            self.events.append(event)

    def wait_for(self, step: str, total: int) -> list[dict[str, Any]]:
        """Every event `step` so far, once there are `total`."""
        self.wait_until(lambda events: sum(event["step"] == step for event in events) >= total, f"{total} {step}")
        return [event for event in self.events if event["step"] == step]

    def stderr(self) -> str:
        """Its stderr, once it exited (called when its stdout ended, or for a failing assertion)."""
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "(still running)"
        assert self.process.stderr is not None
        return self.process.stderr.read()[-2000:]

    def end(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def start_client(
    gateway: RunningGateway, sockets: int, per_socket: int, secure: bool, data: Path, host: str = HOST
) -> Client:
    env = dict(os.environ)
    if secure:
        env["NODE_EXTRA_CA_CERTS"] = str(data / "security" / "tls-cert.pem")
        env.pop("NODE_TLS_REJECT_UNAUTHORIZED", None)
        ports = [gateway.https_url.rsplit(":", 1)[1], gateway.wss_url.rsplit(":", 1)[1]]
    else:
        ports = [str(gateway.http_port), str(gateway.ws_port)]
    mode = "secure" if secure else "plain"
    return Client(node_command("restart_client.js", mode, *ports, str(sockets), str(per_socket), host), env)


def launch(tmp_path: Path, secure: bool, security: str = "") -> RunningGateway:
    """A gateway on disk; a secure one on fixed HTTPS and WSS ports, so that restart() keeps them,
    with `security` added to its [security] table."""
    if not secure:
        return launch_gateway(data_dir=tmp_path / "data")
    config = tmp_path / "gateway.toml"
    config.write_text(f'[security]\n{security}clients = [{{identity = "js-app", read = ["*"], write = ["*"]}}]\n')
    https, wss = free_ports(2)
    args = ("--secure", "--https-port", str(https), "--wss-port", str(wss))
    return launch_gateway(*args, config=config, mqtt=False, data_dir=tmp_path / "data")


def resumes_across_a_restart(tmp_path: Path, *, secure: bool, kill: bool, down_s: float) -> None:
    """Two sepa-js clients of one subscription each; the gateway stopped or killed, down for
    `down_s`, started again on the same ports: both subscribe again and are notified."""
    with contextlib.ExitStack() as gateways:  # every one started, restarts too, stopped on the way out
        gateway = gateways.enter_context(launch(tmp_path, secure))
        client = start_client(gateway, sockets=2, per_socket=1, secure=secure, data=tmp_path / "data")
        try:
            client.wait_for("subscribed", 2)
            if kill:
                gateway.kill()
            else:
                assert gateway.stop() == 0
            closed = client.wait_for("closed", 2)
            # 1001 "going away": the gateway's close frame; 1006: the socket ended without one (kill -9)
            assert sorted(event["code"] for event in closed) == ([1006, 1006] if kill else [1001, 1001]), closed
            client.wait_for("connection-lost", 2)
            time.sleep(down_s)
            gateway = gateways.enter_context(gateway.restart())
            client.wait_for("reconnected", 2)
            client.wait_for("subscribed", 4)  # each a second time: sequence 0 of its new subscription
            gateway.update(f"INSERT DATA {{ {SUBJECT} 42 }}")
            # sepa-js emits "added" for sequence 0 too (no rows here, before and after the restart)
            added = [event for event in client.wait_for("added", 6) if event["values"]]
            assert sorted((event["socket"], event["values"]) for event in added) == [(0, ["42"]), (1, ["42"])], added
            assert client.process.poll() is None
        finally:
            client.end()


def test_sepa_js_resumes_its_subscriptions_after_the_gateway_is_stopped_and_started(tmp_path: Path) -> None:
    resumes_across_a_restart(tmp_path, secure=False, kill=False, down_s=0.0)


def test_secure_sepa_js_resumes_after_the_gateway_is_killed_and_back_seconds_later(tmp_path: Path) -> None:
    resumes_across_a_restart(tmp_path, secure=True, kill=True, down_s=4.0)


def test_two_subscriptions_on_one_socket_crash_sepa_js_when_it_reconnects(tmp_path: Path) -> None:
    """The client's own bug, pinned so that docs/protocol.md stays true: a sepa-js that no longer
    crashes here (a new version) fails this test, and the note can go."""
    with contextlib.ExitStack() as gateways:  # every one started, restarts too, stopped on the way out
        gateway = gateways.enter_context(launch(tmp_path, secure=False))
        client = start_client(gateway, sockets=1, per_socket=4, secure=False, data=tmp_path / "data")
        try:
            client.wait_for("subscribed", 4)
            assert gateway.stop() == 0
            assert client.wait_for("closed", 1)[0]["code"] == 1001
            client.wait_for("connection-lost", 4)  # four listeners on one socket: four reconnection loops
            gateway = gateways.enter_context(gateway.restart())
            assert client.process.wait(timeout=EVENT_TIMEOUT_S) == 1
            stderr = client.stderr()
            assert "WebSocket is not open: readyState 0" in stderr, stderr
            assert "sepa-js/lib/connection.js:21" in stderr, stderr
        finally:
            client.end()


def test_secure_sepa_js_back_after_its_token_expired_gets_each_notification_twice(tmp_path: Path) -> None:
    """Down longer than the token's life: sepa-js subscribes again with the token it subscribed
    with, the gateway answers 401 (an expired token is refused; closing the socket instead would
    send the client round with the same token forever), and sepa-js renews its token and
    subscribes again: it resumes. But the stream it killed stays bound to its connection's
    "reconnected" event, so the application gets each notification twice while the gateway holds
    one subscription: the client's doing, pinned with the note in docs/protocol.md."""
    with contextlib.ExitStack() as gateways:  # every one started, restarts too, stopped on the way out
        gateway = gateways.enter_context(launch(tmp_path, secure=True, security="token_lifetime_s = 10\n"))
        client = start_client(gateway, sockets=1, per_socket=1, secure=True, data=tmp_path / "data")
        try:
            client.wait_for("subscribed", 1)
            gateway.kill()
            client.wait_for("connection-lost", 1)
            time.sleep(12.0)  # past the 10 s token's expiry
            gateway = gateways.enter_context(gateway.restart())
            client.wait_for("subscribed", 3)  # once before; after the renewal, twice
            gateway.update(f"INSERT DATA {{ {SUBJECT} 42 }}")
            added = [event for event in client.wait_for("added", 5) if event["values"]]
            assert [(event["socket"], event["i"], event["values"]) for event in added] == [(0, 0, ["42"])] * 2, added
            assert gateway.metric("sepa_subscriptions") == 1
            failures = gateway.metrics()
            assert failures.get('sepa_security_auth_failures_total{reason="bad_token"}', 0) >= 1, failures
        finally:
            client.end()


def test_secure_sepa_js_clients_of_one_host_all_resume_after_their_tokens_expired(tmp_path: Path) -> None:
    """25 secure sepa-js clients (one subscription each) on this machine's LAN address, whose
    tokens expired while the gateway was down: each is refused (401), renews its token and
    subscribes again. The expired tokens were charged to the host's failure budget: 20 spent it,
    the next subscribes and the renewals got 429, sepa-js's renewal has no catch, and the Node
    process exited 1 with no subscription resumed (docs/security.md)."""
    lan = host_address()
    with contextlib.ExitStack() as gateways:  # every one started, restarts too, stopped on the way out
        gateway = gateways.enter_context(
            launch(tmp_path, secure=True, security=f'host = "{lan}"\ntoken_lifetime_s = 10\n')
        )
        client = start_client(gateway, sockets=25, per_socket=1, secure=True, data=tmp_path / "data", host=lan)
        try:
            client.wait_for("subscribed", 25)
            gateway.kill()
            client.wait_for("connection-lost", 25)
            time.sleep(12.0)  # past the 10 s tokens' expiry
            gateway = gateways.enter_context(gateway.restart())

            def everyone(step: str, values: bool = False) -> Callable[[list[dict[str, Any]]], bool]:
                """Whether each client had `step` since the restart (one with values, if asked)."""

                def done(events: list[dict[str, Any]]) -> bool:
                    since = events[restarted_at:]
                    return {e["socket"] for e in since if e["step"] == step and (e.get("values") or not values)} == set(
                        range(25)
                    )

                return done

            restarted_at = len(client.events)
            client.wait_until(everyone("subscribed"), "every client subscribed again")
            gateway.wait_for_metric("sepa_subscriptions", lambda count: count == 25, timeout=EVENT_TIMEOUT_S)
            gateway.update(f"INSERT DATA {{ {SUBJECT} 42 }}")
            client.wait_until(everyone("added", values=True), "every client notified")
            assert client.process.poll() is None
            assert gateway.metric('sepa_security_auth_failures_total{reason="rate_limited"}') == 0
            # 25 at least: one refused at each reconnection (more if a slow start let one expire before it subscribed)
            assert gateway.metric('sepa_security_auth_failures_total{reason="bad_token"}') >= 25
        finally:
            client.end()
