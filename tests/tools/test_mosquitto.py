"""tools/mosquitto.py: a broker that does not come up is not left running."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.leftovers import children
from tools import mosquitto
from tools.mosquitto import Mosquitto


def test_a_broker_that_does_not_listen_is_killed_before_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker too slow to listen within 5 s (a loaded machine) cannot be made on purpose: a
    stand-in that never listens takes the real one's place. Before, start() raised and left it
    running, and the fixture that called it never got to stop it."""
    never_listens = tmp_path / "mosquitto"
    never_listens.write_text("#!/bin/sh\nexec sleep 300\n")
    never_listens.chmod(0o755)
    monkeypatch.setattr(mosquitto, "MOSQUITTO", str(never_listens))
    broker = Mosquitto(tmp_path)
    before = children()
    with pytest.raises(RuntimeError, match="did not listen"):
        broker.start()
    assert children() - before == set()
    assert broker.process is None
