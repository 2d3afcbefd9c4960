"""`sepa-gateway sensors ... --coap` as the README writes it: the CoAP options before or after the action."""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

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


SERVICE_UID = 65534  # nobody: the service user, owner of the data directory


def test_root_cli_never_writes_or_chowns_through_the_service_users_symlinks(tmp_path: Path) -> None:
    """Attack pass: the service user owns coap-sensors/NAME; it made `.paths.json.new` a symlink to
    a root-only file, and root's `sensors allow --coap` truncated, rewrote and chowned that file.
    The names `add --reset` writes, planted the same way, are replaced, not followed."""
    if os.geteuid() != 0:
        pytest.fail("what root's CLI does to a root-only file needs root: the tests run as root", pytrace=False)
    data = tmp_path / "data"
    data.mkdir()
    os.chown(data, SERVICE_UID, SERVICE_UID)
    directory = data / "coap"
    assert sensors("add", "boiler", "--coap", "--coap-dir", str(directory)).returncode == 0
    folder = directory / "boiler"
    assert {path.stat().st_uid for path in (directory, folder, folder / "settings.json")} == {SERVICE_UID}
    victim = tmp_path / "root-only"
    victim.write_text("ROOT-ONLY\n")
    os.chmod(victim, 0o600)
    for link in (folder / ".paths.json.new", folder / ".paths.json.tmp", directory / ".pump.new", directory / "pump"):
        link.symlink_to(victim)
        os.chown(link, SERVICE_UID, SERVICE_UID, follow_symlinks=False)

    allowed = sensors("allow", "boiler", "--coap", "--coap-dir", str(directory), "--path", "s/foo/#")
    made = sensors("add", "pump", "--reset", "--coap", "--coap-dir", str(directory))

    status = victim.stat()
    assert (status.st_uid, stat.S_IMODE(status.st_mode), victim.read_text()) == (0, 0o600, "ROOT-ONLY\n")
    assert allowed.returncode == 0 and made.returncode == 0, allowed.stderr + made.stderr
    assert json.loads((folder / "paths.json").read_text()) == ["s/foo/#"]
    for path in (folder / "paths.json", directory / "pump", directory / "pump" / "settings.json"):
        assert not path.is_symlink() and path.stat().st_uid == SERVICE_UID, path


def test_root_cli_before_the_service_leaves_it_directories_it_can_use(tmp_path: Path) -> None:
    """Attack pass: root's `sensors add --coap` before the service ever made `data/` created it
    root's (and 0777 under umask 000): the service then could not open its store, and a later
    `clients add` made `security/` and `clients.json` root's too. Every directory the CLI makes is
    the service's (the nearest existing one's owner) and 0700, whatever the umask."""
    if os.geteuid() != 0:
        pytest.fail("what root's CLI leaves to the service user needs root: the tests run as root", pytrace=False)
    state = tmp_path / "state"
    state.mkdir(mode=0o750)
    os.chown(state, SERVICE_UID, SERVICE_UID)
    data = state / "data"
    for argv in (
        ["sensors", "--coap", "--coap-dir", str(data / "coap-sensors"), "add", "boiler"],
        ["clients", "--data-dir", str(data), "add", "dashboard", "--read", "*"],
    ):
        done = subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=60, umask=0)
        assert done.returncode == 0, done.stderr

    made = [data, data / "coap-sensors", data / "coap-sensors" / "boiler", data / "security"]
    made += [data / "security" / "clients.json", data / "coap-sensors" / "boiler" / "settings.json"]
    for path in made:
        status = path.lstat()
        assert (status.st_uid, status.st_gid) == (SERVICE_UID, SERVICE_UID), path
        assert stat.S_IMODE(status.st_mode) & 0o077 == 0, (path, oct(status.st_mode))


def test_coap_credentials_go_where_the_configured_gateway_reads_them(tmp_path: Path) -> None:
    """`sensors --coap` wrote into /var/lib/sepa-gateway/data/coap-sensors whatever the configuration
    said: a gateway with [coap] oscore_dir or another [store] data_dir never saw the sensor."""
    oscore_dir, data_dir = tmp_path / "oscore", tmp_path / "data"
    by_coap = tmp_path / "by-coap.toml"
    by_coap.write_text(f'[store]\ndata_dir = "{data_dir}"\n[coap]\noscore_dir = "{oscore_dir}"\n')
    by_store = tmp_path / "by-store.toml"
    by_store.write_text(f'[store]\ndata_dir = "{data_dir}"\n')
    assert sensors("add", "boiler", "--coap", "--config", str(by_coap)).returncode == 0
    assert sensors("--coap", "--config", str(by_store), "add", "pump").returncode == 0
    assert sensors("list", "--coap", "--config", str(by_coap)).stdout.split() == ["boiler"]
    assert sensors("list", "--coap", "--config", str(by_store)).stdout.split() == ["pump"]
    assert (oscore_dir / "boiler").is_dir() and (data_dir / "coap-sensors" / "pump").is_dir()
    in_memory = tmp_path / "in-memory.toml"
    in_memory.write_text("[engine]\nmode = 'sequential'\n")
    refused = sensors("add", "valve", "--coap", "--config", str(in_memory))
    assert refused.returncode == 2 and "the gateway keeps no CoAP credentials" in refused.stderr


def test_the_installed_file_goes_with_the_installed_data_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The installed unit runs the file (data_dir = "") with --data-dir /var/lib/sepa-gateway/data:
    `sudo sepa-gateway sensors add boiler --coap` keeps writing there."""
    from gateway.appliance.commands import sensors as command

    installed = tmp_path / "sepa-gateway.toml"
    installed.write_text((Path(__file__).resolve().parents[4] / "systemd" / "sepa-gateway.toml").read_text())
    monkeypatch.setattr(command, "INSTALLED_CONFIG", installed)
    found = command.coap_directory(argparse.Namespace(coap_dir=None, config=None))
    assert found == Path("/var/lib/sepa-gateway/data/coap-sensors")
