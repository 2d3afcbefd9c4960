"""`sepa-gateway clients`: the operator's registry commands, run as a user runs them (a subprocess)."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from broker.api import ClientRegistry, RegistryError

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
    assert again.returncode == 1 and "already registered" in again.stderr  # the operator is told why
    assert clients(security, "reset", "app", "--open").returncode == 0
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


def test_reset_registers_anew_here_unless_opened_to_the_network(tmp_path: Path) -> None:
    """A plain reset forgot the registration so that the client "may register once more" over the
    network, where whoever stole the old secret knows the name and registered first every time:
    rotating a stolen secret gave the thief a new one. `reset` now registers anew in the same
    locked edit and prints the credentials; `reset --open` only forgets, and says who may take it."""
    security = tmp_path / "security"
    first = json.loads(clients(security, "add", "app", "--read", "*", "--register").stdout)
    for args in (("reset", "app"), ("reset", "app", "--register")):
        done = clients(security, *args)
        assert done.returncode == 0, done.stderr
        credentials = json.loads(done.stdout)
        assert "shown only once" in done.stderr
        client = ClientRegistry(security).get("app")
        assert client is not None and client.client_id == credentials["client_id"] != first["client_id"]
        assert client.secret_matches(credentials["client_secret"]) and not client.secret_matches(first["client_secret"])
        first = credentials
    opened = clients(security, "reset", "app", "--open")
    assert opened.returncode == 0 and "the first to send its name to /oauth/register gets it" in opened.stdout
    assert ClientRegistry(security).get("app").client_id is None  # type: ignore[union-attr]
    both = clients(security, "reset", "app", "--open", "--register")
    assert both.returncode == 2 and "not allowed with" in both.stderr
    assert clients(security, "reset", "nobody").stderr.strip() == "sepa-gateway clients: no client 'nobody'"
    assert "--open" in subprocess.run([*CLI, "clients", "reset", "--help"], capture_output=True, text=True).stdout


@pytest.mark.parametrize("command", [("add", "--read", "*", "--register"), ("reset",)])
def test_the_cli_registers_before_any_network_registrant_can(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: tuple[str, ...]
) -> None:
    """Attack pass: a LAN host polling /oauth/register for a name took it in 8 races of 10 against
    `clients add NAME --register` (allowed, then registered: two locked edits), and after every
    `clients reset`. A thread registers each name in a loop, as the gateway would for that host,
    while the command runs in this process: the network never gets it."""
    from gateway.appliance.cli import main

    lost = []
    for round in range(20):
        security, name = tmp_path / str(round), f"app{round}"
        security.mkdir(mode=0o700)
        if command[0] == "reset":
            ClientRegistry(security).add_and_register(name, "before")
        gateway, stop = ClientRegistry(security), threading.Event()

        def network(gateway: ClientRegistry = gateway, name: str = name, stop: threading.Event = stop) -> None:
            while not stop.is_set():
                with contextlib.suppress(RegistryError):
                    gateway.register(name, "now")
                    return

        thread = threading.Thread(target=network)
        thread.start()
        try:
            code = main(["clients", "--security-dir", str(security), command[0], name, *command[1:]])
        finally:
            stop.set()
            thread.join()
        printed = capsys.readouterr().out
        client = ClientRegistry(security).get(name)
        if code != 0 or client is None or json.loads(printed)["client_id"] != client.client_id:
            lost.append(name)
    assert lost == []
