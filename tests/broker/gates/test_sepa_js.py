"""The SEPA project's JavaScript client, @arces-wot/sepa-js from the npm registry, unchanged, over
the secure gates: it registers, gets a token, updates, queries, subscribes, is notified and
unsubscribes, and hears why a subscription past the row limit ended
(tests/broker/gates/js/secure_client.js, run with Node). tests/run.sh installs it with
`npm ci` from the committed lock file; a missing Node or package fails the test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tools.launcher import launch_gateway

JS = Path(__file__).parent / "js"


def test_sepa_js_over_the_secure_gates(tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None or not (JS / "node_modules" / "@arces-wot" / "sepa-js").is_dir():
        pytest.fail(
            "Node.js and tests/broker/gates/js/node_modules are needed: tests/run.sh installs them", pytrace=False
        )
    config = tmp_path / "gateway.toml"
    config.write_text(
        "[websocket]\nmax_subscription_rows = 5\n"
        '[security]\nclients = [{identity = "js-app", read = ["*"], write = ["*"]}]\n'
    )
    gateway = launch_gateway("--secure", "--no-mqtt", config=config, data_dir=tmp_path / "data")
    try:
        env = {**os.environ, "NODE_EXTRA_CA_CERTS": str(tmp_path / "data" / "security" / "tls-cert.pem")}
        env.pop("NODE_TLS_REJECT_UNAUTHORIZED", None)
        ports = [str(urlsplit(gateway.https_url).port), str(urlsplit(gateway.wss_url).port)]
        done = subprocess.run(
            [node, str(JS / "secure_client.js"), *ports, "js-app"],
            cwd=JS,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        steps = {line["step"]: line for line in map(json.loads, done.stdout.splitlines())}
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert steps["update"]["status"] == 200
        assert steps["query"]["values"] == ["true"]
        assert steps["notification"]["values"] == ["40"]
        assert "unsubscribed" in steps
        # 413, not 400: sepa-js took the 400 for an expired token and subscribed again in a loop
        assert steps["ended"] == {"step": "ended", "error": "result_too_large", "status": 413}, steps
        metrics = gateway.metrics()
        assert metrics["sepa_subscriptions"] == 0
        assert metrics.get('sepa_errors_total{error="ws_invalid_request",status="400"}', 0) == 0
    finally:
        assert gateway.stop() == 0
