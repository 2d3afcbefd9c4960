"""`sepa-gateway clients`: the operator's registry commands, run as a user runs them (a subprocess)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from broker.api import ClientRegistry

CLI = [sys.executable, "-c", "import sys; from gateway.appliance.cli import main; sys.exit(main())"]


def clients(security: Path, *args: str, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    options = ["--security-dir", str(security)] + (["--config", str(config)] if config else [])
    return subprocess.run([*CLI, "clients", *options, *args], capture_output=True, text=True, timeout=60)


def test_add_allow_revoke_reset_and_list(tmp_path: Path) -> None:
    security = tmp_path / "security"
    assert clients(security, "add", "dash", "--read", "*", "--write", "http://ex/g").returncode == 0
    assert clients(security, "add", "viewer", "--read", "default").returncode == 0
    assert clients(security, "allow", "viewer", "--read", "http://ex/g").returncode == 0
    assert clients(security, "revoke", "viewer", "--read", "default").returncode == 0
    listed = json.loads(clients(security, "list", "--json").stdout)
    assert listed["dash"]["read"] == ["*"] and listed["dash"]["write"] == ["http://ex/g"]
    assert listed["viewer"] == {
        "read": ["http://ex/g"],
        "write": [],
        "revoked": False,
        "client_id": None,
        "registered": None,
        "in_config": False,
    }
    assert clients(security, "revoke", "viewer").returncode == 0
    assert json.loads(clients(security, "list", "--json").stdout)["viewer"]["revoked"] is True
    assert stat.S_IMODE(security.stat().st_mode) == 0o700
    assert stat.S_IMODE((security / "clients.json").stat().st_mode) == 0o600


def test_register_on_the_gateway_prints_credentials_once_and_stores_only_a_hash(tmp_path: Path) -> None:
    security = tmp_path / "security"
    done = clients(security, "add", "app", "--read", "*", "--register")
    assert done.returncode == 0, done.stderr
    credentials = json.loads(done.stdout)
    registry = ClientRegistry(security)
    client = registry.by_client_id(credentials["client_id"])
    assert client is not None and client.secret_matches(credentials["client_secret"])
    assert credentials["client_secret"] not in (security / "clients.json").read_text()
    again = clients(security, "add", "app", "--register")
    assert again.returncode == 1 and "already registered" in again.stderr
    assert clients(security, "reset", "app").returncode == 0
    assert ClientRegistry(security).by_client_id(credentials["client_id"]) is None  # its tokens die with it


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("add", "bad id"), "client identity"),
        (("add", "ok", "--read", "not a graph"), "not a graph"),
        (("allow", "nobody", "--read", "*"), "no client 'nobody'"),
        (("revoke", "nobody"), "no client 'nobody'"),
    ],
)
def test_bad_requests_are_one_line_and_exit_1(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    done = clients(tmp_path / "security", *args)
    assert done.returncode == 1 and message in done.stderr and "Traceback" not in done.stderr


def test_rights_from_the_toml_are_listed_and_kept(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text('[security]\nclients = [{identity = "plant", read = ["*"], write = ["default"]}]\n')
    security = tmp_path / "security"
    listed = json.loads(clients(security, "list", "--json", config=config).stdout)
    assert listed["plant"]["in_config"] is True and listed["plant"]["write"] == ["default"]
    refused = clients(security, "revoke", "plant", "--write", "default", config=config)
    assert refused.returncode == 1 and "TOML" in refused.stderr
    assert clients(security, "revoke", "plant", config=config).returncode == 0
    assert json.loads(clients(security, "list", "--json", config=config).stdout)["plant"]["revoked"] is True


def test_a_client_chosen_value_cannot_forge_a_log_line() -> None:
    """A registration's identity is logged as the client sent it: its line breaks stay escaped."""
    import logging

    from gateway.appliance.logs import KeyValueFormatter

    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "registration refused", None, None)
    record.identity = 'evil\nts=2026 level=info msg="client registered"'
    line = KeyValueFormatter().format(record)
    assert "\n" not in line and 'identity="evil\\nts=2026 level=info msg=\\"client registered\\""' in line


SERVICE_UID = 65534  # nobody: the service user, owner of the security directory


def _plant(security: Path, name: str, target: Path) -> None:
    """As the service user would: `name` in its security directory made a symlink to `target`."""
    (security / name).symlink_to(target)
    os.chown(security / name, SERVICE_UID, SERVICE_UID, follow_symlinks=False)


@pytest.mark.parametrize("planted", ["clients.lock", "clients.json", "clients.json.tmp", "hard link: clients.lock"])
def test_root_cli_never_writes_reads_or_chowns_through_the_service_users_symlinks(tmp_path: Path, planted: str) -> None:
    """Attack pass: the service user owns the security directory; it made `clients.lock` a symlink
    to a root-only file, and root's `clients add` gave that file to it (open O_CREAT and chown both
    followed the link). `clients.json.tmp` was truncated and rewritten through the link, and a
    `clients.json` link made root copy a root-only JSON file's clients into the service's file.
    A hard link as the lock is refused too (chown on it is the file's)."""
    if os.geteuid() != 0:
        pytest.fail("what root's CLI does to a root-only file needs root: the tests run as root", pytrace=False)
    security = tmp_path / "security"
    security.mkdir(mode=0o700)
    assert clients(security, "add", "dash", "--read", "*").returncode == 0
    os.chown(security, SERVICE_UID, SERVICE_UID)
    for name in os.listdir(security):
        os.chown(security / name, SERVICE_UID, SERVICE_UID)
    victim = tmp_path / "root-only.json"
    secret = '{"clients": {"root-secret": {"read": ["*"]}}}'
    victim.write_text(secret)
    os.chmod(victim, 0o600)
    name = planted.removeprefix("hard link: ")
    (security / name).unlink(missing_ok=True)
    if name != planted:  # a hard link, where fs.protected_hardlinks does not stop the service user
        os.link(victim, security / name)
    else:
        _plant(security, name, victim)

    clients(security, "add", "viewer", "--read", "default")

    status = victim.stat()
    assert (status.st_uid, status.st_gid, stat.S_IMODE(status.st_mode)) == (0, 0, 0o600)
    assert victim.read_text() == secret
    stored = security / "clients.json"
    assert "root-secret" not in (stored.read_text() if not stored.is_symlink() else "")
    for path in security.iterdir():  # what root left there is the service user's, and no link was followed
        assert path.is_symlink() or path.samefile(victim) or path.stat().st_uid == SERVICE_UID, path
