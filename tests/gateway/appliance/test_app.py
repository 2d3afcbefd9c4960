"""gateway.appliance.app.Gateway refused at start, in a process that goes on (the tests, an
embedding application): what it had started is closed before the error goes on.

Before (2026-12-07): a [shipper] on an in-memory store, refused once the query workers were up,
left two `broker.workers.replica` processes running per refusal (found by tests/support/leftovers.py
in test_shipper_config.py). The real CLI left none (its process ends, and the workers die with the
thread that started them), which tests/gateway/appliance/commands/test_run.py checks too."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.appliance.app import Gateway
from gateway.appliance.config import Config, ConfigError
from tests.support.leftovers import children


def local(config: Config) -> Config:
    """`config` on 127.0.0.1 and ports the OS picks, without the adapters (none is the point here)."""
    config.http.host = "127.0.0.1"
    config.http.port = config.websocket.port = 0
    for name in ("mqtt", "coap"):
        if name in config.adapters:
            config.adapter(name).enabled = False
    return config.validate()


def test_a_gateway_refused_while_built_leaves_no_process(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("secret-token\n")
    config = Config()
    config.shipper.enabled = True
    config.shipper.url = "https://cloud.example"
    config.shipper.token_file = str(token)  # and no spool_dir on an in-memory store: refused
    before = children()
    with pytest.raises(ConfigError, match="spool_dir is required"):
        Gateway(local(config))
    assert children() - before == set()


def test_a_gateway_whose_start_fails_leaves_no_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault the start cannot recover from, after the workers are up and before the listeners
    (here the delayed updates' start, failing as a disk would: a fault injected, none to cause)."""
    before = children()
    gateway = Gateway(local(Config()))
    assert children() - before  # the query workers

    async def broken() -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(gateway.scheduler.delayed, "start", broken)
    with pytest.raises(OSError, match="Input/output error"):
        asyncio.run(gateway.start())
    assert children() - before == set()
