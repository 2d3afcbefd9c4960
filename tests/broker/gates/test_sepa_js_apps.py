"""The SEPA project's JavaScript client, @arces-wot/sepa-js, unchanged, as applications use it over
the plain gates (tests/broker/gates/js/jsap_client.js): a JSAP-driven application with namespaces,
forced bindings and a per-entry subscribe gate, several subscriptions on one socket (SELECT, ASK, a
syntax error), array bindings, an HTTP error. test_sepa_js.py covers the secure gates.
A missing Node or package fails the test (tests/run.sh installs them with `npm ci`)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tools.launcher import launch_gateway

JS = Path(__file__).parent / "js"
EX = "http://example.org/app#"


def node_command(script: str, *args: str) -> list[str]:
    """argv running `script` of tests/broker/gates/js with Node; the test fails without them."""
    node = shutil.which("node")
    if node is None or not (JS / "node_modules" / "@arces-wot" / "sepa-js").is_dir():
        pytest.fail(
            "Node.js and tests/broker/gates/js/node_modules are needed: tests/run.sh installs them", pytrace=False
        )
    return [node, str(JS / script), *args]


def read_step(client: subprocess.Popen[str], steps: dict[str, Any]) -> str:
    """The next step line of `client`, kept in `steps`; fails on EOF with everything it said."""
    assert client.stdout is not None
    line = client.stdout.readline()
    assert line, (steps, client.stderr.read()[-1500:] if client.stderr else "")
    step = json.loads(line)
    steps[step["step"]] = step
    assert step["step"] != "failed", step
    return step["step"]


def test_a_jsap_application_over_the_plain_gates() -> None:
    with launch_gateway() as gateway:
        client = subprocess.Popen(
            node_command("jsap_client.js", str(gateway.http_port), str(gateway.ws_port)),
            cwd=JS,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        steps: dict[str, Any] = {}
        try:
            while read_step(client, steps) != "unsubscribed":
                pass
            both = sorted([{"lamp": EX + "lamp1", "level": "10"}, {"lamp": EX + "lamp2", "level": "70"}], key=str)
            assert sorted(steps["query"]["rows"], key=str) == both
            first = steps["first"]
            assert sorted(first["LEVELS"], key=str) == both
            assert first["LEVEL"] == [{"level": "10"}]
            assert first["HIGH"] is True
            assert first["BROKEN"] == {"error": "invalid_request", "status": 400}  # its error event, no hang
            assert steps["sockets"]["count"] == 1
            assert steps["notified"] == {"step": "notified", "added": [{"level": "55"}], "removed": [{"level": "10"}]}
            assert steps["forced"]["rows"] == [{"name": "shelf"}]
            assert sorted(row["level"] for row in steps["values"]["rows"]) == ["55", "70"]
            assert steps["query-error"] == {"step": "query-error", "status": 400, "error": "invalid_request"}
            gateway.wait_for_metric("sepa_subscriptions", lambda value: value == 0)
            assert client.wait(timeout=30) == 0
        finally:
            if client.poll() is None:
                client.kill()
                client.wait()
