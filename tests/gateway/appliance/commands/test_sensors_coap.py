"""`sepa-gateway sensors ... --coap` as the README writes it: the CoAP options before or after the action."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-c", "import sys; from gateway.appliance.cli import main; sys.exit(main())"]


def sensors(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "sensors", *argv], capture_output=True, text=True, timeout=60)


def test_coap_options_go_before_or_after_the_action(tmp_path: Path) -> None:
    directory = str(tmp_path / "coap")
    made = sensors("add", "boiler", "--coap", "--coap-dir", directory)
    assert made.returncode == 0, made.stderr
    assert '"secret_hex"' in made.stdout
    assert sensors("--coap", "--coap-dir", directory, "list").stdout.split() == ["boiler"]
    assert sensors("list", "--coap", "--coap-dir", directory).stdout.split() == ["boiler"]
    allowed = sensors("allow", "boiler", "--coap", "--coap-dir", directory, "--path", "plant/#", "--path", "s/+/t")
    assert allowed.returncode == 0, allowed.stderr
    assert (tmp_path / "coap" / "boiler" / "paths.json").read_text() == '["plant/#", "s/+/t"]'
    refused = sensors("allow", "boiler", "--coap", "--coap-dir", directory, "--path", "a/#/b")
    assert refused.returncode == 1 and "# only last" in refused.stderr
    mqtt = sensors("allow", "boiler", "--path", "x")
    assert mqtt.returncode == 2 and "--coap" in mqtt.stderr
    removed = sensors("remove", "boiler", "--coap", "--coap-dir", directory)
    assert removed.returncode == 0, removed.stderr
    assert sensors("list", "--coap", "--coap-dir", directory).stdout.split() == []
