"""The `sepa-gateway` command itself: `--version` as an operator types it.

Protects: the version printed is the installed package's, which is pyproject.toml's (one source of
truth), and it needs no subcommand; `--version`, `--help` and the commands' own help import only
what they need (not the store, the gates, the adapters or Spark), and so does `sepa-cloud --help`;
`check-config` checks every plug-in's section without a network library, the network client
commands load no in-process transport (the broker's pipeline), and the landing no broker.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def test_version_is_the_packages(gateway_command: list[str]) -> None:
    done = subprocess.run([*gateway_command, "--version"], capture_output=True, text=True, timeout=60)
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert (done.returncode, done.stdout, done.stderr) == (0, f"sepa-gateway {declared}\n", "")
    assert version("sepa-gateway") == declared


# what a light command must not import: the store, the gates, the adapters' protocols, Spark
HEAVY = ("pyoxigraph", "aiohttp", "aiocoap", "paho", "pyspark")


def _modules(command: list[str]) -> set[str]:
    """The modules `command` imported, as Python's -X importtime reports them."""
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert lines, done.stderr[-2000:]  # the report is there: an empty set is not a silent pass
    return {line.rpartition("|")[2].strip() for line in lines}


def _imported(command: list[str]) -> set[str]:
    """The top-level packages `command` imported."""
    return {module.partition(".")[0] for module in _modules(command)}


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["bench", "--help"]])
def test_light_commands_import_neither_the_store_nor_the_gates(gateway_command: list[str], args: list[str]) -> None:
    """Why: every command imported the whole broker (1.4-2.2 CPU-s on 2026-12-07, 5-8x on a Pi)."""
    assert _imported([*gateway_command, *args]) & set(HEAVY) == set()


def test_cloud_help_imports_neither_the_landing_nor_spark() -> None:
    """`sepa-cloud --help` (and the Spark commands' start) need not load aiohttp and the broker."""
    assert _imported([sys.executable, "-m", "cloud.cli", "--help"]) & set(HEAVY) == set()


# every check of the adapters' sections that could need their runtime: actuators, observed
# resources, subscriptions (parsed by pyoxigraph), mappings
EVERY_PLUGIN_CHECK = """
[[mqtt.actuators]]
id = "lamp-power"
query = 'SELECT ?lamp ?power WHERE { ?lamp <urn:example:on> ?power }'
topic = "cmnd/{lamp}/POWER"
payload = "{power}"

[[mqtt.mappings]]
id = "boiler"
topic = "boiler/temperature"
extract = "number"
property = "temperature"
sensor = "urn:example:boiler"

[[coap.subscriptions]]
name = "lamps"
sparql = "SELECT ?lamp ?on WHERE { ?lamp <urn:example:on> ?on }"

[[coap.observe]]
uri = "coap://[fd00::12]/temperature"

[[coap.actuators]]
id = "valve"
query = 'SELECT ?valve ?open WHERE { ?valve <urn:example:open> ?open }'
uri = "coap://valve-{valve}.local/open"
payload = "{open}"
"""


@pytest.mark.parametrize("which", ["annotated", "every-plugin-check"])
def test_check_config_imports_no_network_library(gateway_command: list[str], tmp_path: Path, which: str) -> None:
    """Why: the adapters' checks imported aiocoap, paho, aiohttp and the broker's pipeline (2.1 CPU-s on
    2026-12-07, 5-8x on a Pi), and the installer runs check-config at every install and upgrade.
    pyoxigraph it needs: IRIs and the subscriptions' SPARQL are checked by its parsers."""
    path = REPO / "systemd" / "sepa-gateway.toml"
    if which == "every-plugin-check":
        path = tmp_path / "sepa-gateway.toml"
        path.write_text(EVERY_PLUGIN_CHECK)
    modules = _modules([*gateway_command, "check-config", str(path)])
    assert {module.partition(".")[0] for module in modules} & set(HEAVY) == {"pyoxigraph"}
    assert {"gateway.client.inprocess", "broker.core.engine"} & modules == set()


@pytest.mark.parametrize("command", ["query", "update", "subscribe"])
def test_network_client_commands_load_no_in_process_transport(gateway_command: list[str], command: str) -> None:
    """Why: `gateway.client` imported the in-process transport and with it the broker's pipeline (1.29
    CPU-s for `query --help` on 2026-12-07). They need aiohttp (the network transport) and pyoxigraph
    (the terms of the results)."""
    modules = _modules([*gateway_command, command, "--help"])
    assert {module.partition(".")[0] for module in modules} & set(HEAVY) == {"aiohttp", "pyoxigraph"}
    assert {"gateway.client.inprocess", "broker.core.pipeline", "broker.core.engine"} & modules == set()


def test_landing_imports_neither_the_broker_nor_the_client() -> None:
    """Why: the landing's contract is the shipper's (gateway/shipper/contract.py), and importing it
    imported the shipper, the client and the broker. The landing needs aiohttp (its server) only."""
    modules = _modules([sys.executable, "-c", "import cloud.cli, cloud.server"])
    assert {module.partition(".")[0] for module in modules} & set(HEAVY) == {"aiohttp"}
    assert {module for module in modules if module.startswith(("broker.", "gateway.client"))} == set()
