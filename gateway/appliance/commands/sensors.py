"""``sepa-gateway sensors add | list | remove``: logins of the sensors that publish to the gateway.

MQTT logins by default; with ``--coap``, the sensor's OSCORE security context for CoAP
(:mod:`gateway.appliance.oscore_sensors`), printed once as the settings the sensor needs.

Why through Mosquitto's own tool: the installed Mosquitto refuses anonymous clients on its LAN
listener and checks logins against a password file; ``mosquitto_passwd`` writes the hashes (never
hand-rolled here). The password is handed to it in a 0600 temporary file (``mosquitto_passwd -U``),
not on a command line other local users could read from /proc. After a change Mosquitto is told to
reload the file (SIGHUP to the pid in its pid file, else ``systemctl reload mosquitto``).

:func:`create_login` is the one place a sensor credential is made, so that other adapters (CoAP)
and the install script (the gateway's own MQTT login) use the same code.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from broker.api import write_file
from gateway.appliance import mqtt_acl, oscore_sensors
from gateway.appliance.commands.clients import INSTALLED_CONFIG, INSTALLED_DATA_DIR
from gateway.appliance.config import ConfigError, load_config
from gateway.appliance.oscore_sensors import OSCORE_DIR

PASSWORD_FILE = Path("/etc/mosquitto/sepa-gateway.passwd")
COAP_DIR = INSTALLED_DATA_DIR / OSCORE_DIR  # the installed service's, when no configuration is found
PID_FILE = Path("/run/mosquitto/mosquitto.pid")  # pid_file of Debian's /etc/mosquitto/mosquitto.conf
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class LoginError(Exception):
    """A login cannot be made or removed (said in one line)."""


def logins(password_file: Path) -> list[str]:
    """The user names in a Mosquitto password file."""
    if not password_file.exists():
        return []
    return [line.split(":", 1)[0] for line in password_file.read_text().splitlines() if ":" in line]


def create_login(password_file: Path, name: str, *, reset: bool = False) -> str:
    """Add (or with `reset`, replace) the login `name`; returns its new random password."""
    if not NAME.fullmatch(name):
        raise LoginError("a sensor name is 1-64 characters: letters, digits and . _ - (not first)")
    if name in logins(password_file) and not reset:
        raise LoginError(f"{name!r} already has a login (--reset gives it a new password)")
    tool = shutil.which("mosquitto_passwd")
    if tool is None:
        raise LoginError("mosquitto_passwd is not installed (Debian package mosquitto)")
    password = secrets.token_urlsafe(18)
    with tempfile.TemporaryDirectory() as folder:
        entry = Path(folder) / "entry"
        entry.write_text(f"{name}:{password}\n")
        os.chmod(entry, 0o600)
        done = subprocess.run([tool, "-U", str(entry)], capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise LoginError(f"mosquitto_passwd failed: {done.stderr.strip() or done.stdout.strip()}")
        hashed = entry.read_text().strip()
    kept = [line for line in _lines(password_file) if line.split(":", 1)[0] != name]
    _write(password_file, [*kept, hashed])
    mqtt_acl.write_acl(password_file, logins(password_file))
    return password


def remove_login(password_file: Path, name: str) -> None:
    kept = [line for line in _lines(password_file) if line.split(":", 1)[0] != name]
    if len(kept) == len(_lines(password_file)):
        raise LoginError(f"no login {name!r}")
    _write(password_file, kept)
    mqtt_acl.write_acl(password_file, logins(password_file))  # its grants go with it


def _lines(password_file: Path) -> list[str]:
    return [line for line in password_file.read_text().splitlines() if line.strip()] if password_file.exists() else []


def _write(password_file: Path, lines: list[str]) -> None:
    """Replace the file atomically, keeping its owner and mode (Mosquitto must still read it)."""
    existing = password_file.stat() if password_file.exists() else None
    mode = existing.st_mode & 0o777 if existing else 0o600
    owner = (existing.st_uid, existing.st_gid) if existing else None
    write_file(password_file, "".join(f"{line}\n" for line in lines).encode(), mode, owner)


def reload_mosquitto(pid_file: Path = PID_FILE) -> str:
    """Ask the running Mosquitto to read its password and ACL files again; says what was done (never raises:
    the login is made either way, and the operator is told how to apply it).

    SIGHUP to the pid in Mosquitto's pid file first: it is what ``systemctl reload mosquitto`` does
    (Debian's unit: ExecReload=kill -HUP $MAINPID), it also reaches a Mosquitto started without
    systemd, and it never signals a Mosquitto that is not the one the file names (a test broker, another
    user's). Without a running one named there, systemd is asked.
    """
    pid = _mosquitto_pid(pid_file)
    if pid is not None:
        try:
            os.kill(pid, signal.SIGHUP)
        except OSError as error:
            return f"could not signal mosquitto (pid {pid}): {error.strerror}; restart it to apply the change"
        return f"mosquitto (pid {pid}) told to reload its password and ACL files (SIGHUP)"
    if Path("/run/systemd/system").is_dir() and shutil.which("systemctl"):
        done = subprocess.run(["systemctl", "reload", "mosquitto"], capture_output=True, text=True, timeout=30)
        if done.returncode == 0:
            return "mosquitto reloaded its password and ACL files (systemctl reload mosquitto)"
        return f"could not reload mosquitto ({done.stderr.strip()}): restart it to apply the change"
    return f"no running mosquitto named in {pid_file}: the change applies when mosquitto next starts"


def _mosquitto_pid(pid_file: Path) -> int | None:
    """The pid in `pid_file` if a process of that pid is a Mosquitto (a stale file names another one)."""
    try:
        pid = int(pid_file.read_text().strip())
        command = Path(f"/proc/{pid}/comm").read_text().strip()
    except (OSError, ValueError):
        return None
    return pid if command == "mosquitto" else None


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sensors",
        description="Create, list and remove the logins sensors use to publish to the gateway's Mosquitto.",
    )
    parser.add_argument(
        "--password-file", type=Path, default=PASSWORD_FILE, help=f"Mosquitto's password file (default {PASSWORD_FILE})"
    )
    parser.add_argument("--no-reload", action="store_true", help="do not tell Mosquitto to reload the file")
    parser.add_argument(
        "--pid-file", type=Path, default=PID_FILE, help=f"Mosquitto's pid file, for the reload (default {PID_FILE})"
    )
    parser.add_argument("--host", default="", help="the host name sensors use, in the printed example")
    _coap_options(parser, None, False)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    # the CoAP options after the action too (`sensors add boiler --coap`, as the README writes it):
    # SUPPRESS keeps the ones given before it
    after = argparse.ArgumentParser(add_help=False)
    _coap_options(after, argparse.SUPPRESS, argparse.SUPPRESS, argparse.SUPPRESS)
    add = actions.add_parser("add", parents=[after], help="create a login and print its password (shown only once)")
    add.add_argument("name")
    add.add_argument("--reset", action="store_true", help="give an existing login a new password")
    actions.add_parser("list", parents=[after], help="the logins in the password file")
    remove = actions.add_parser("remove", parents=[after], help="remove a login")
    remove.add_argument("name")
    allow = actions.add_parser(
        "allow",
        parents=[after],
        help="the topics a login may publish (--topic) and subscribe to (--commands) besides its own device's;"
        " with --coap, the paths it may post to besides its own s/NAME/... (--path); + one level, # the rest;"
        " the grants replace the earlier ones, none: its own only",
    )
    allow.add_argument("name")
    allow.add_argument("--path", action="append", default=[], dest="patterns", metavar="PATTERN")
    allow.add_argument("--topic", action="append", default=[], dest="topics", metavar="PATTERN")
    allow.add_argument("--commands", action="append", default=[], metavar="PATTERN")
    actions.add_parser(
        "acl",
        parents=[after],
        help="write Mosquitto's ACL file again from the logins, and print it (the installer runs it)",
    )
    parser.set_defaults(handler=run)


def _coap_options(parser: argparse.ArgumentParser, directory: Any, coap: Any, config: Any = None) -> None:
    parser.add_argument(
        "--coap", action="store_true", default=coap, help="CoAP credentials (OSCORE contexts), not MQTT logins"
    )
    parser.add_argument(
        "--coap-dir",
        type=Path,
        default=directory,
        help="where the CoAP credentials are kept (default: the configuration's [coap] oscore_dir, else "
        f"<[store] data_dir>/{OSCORE_DIR}; {COAP_DIR} when there is no configuration)",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=config,
        help=f"the gateway's TOML, for --coap (default: {INSTALLED_CONFIG} if present)",
    )


def coap_directory(args: argparse.Namespace) -> Path:
    """Where the gateway reads its sensors' OSCORE contexts, as its CoAP plug-in builds it. Why not a
    fixed directory: a gateway with [coap] oscore_dir or another [store] data_dir never saw the
    contexts `sensors --coap add` wrote into /var/lib/sepa-gateway/data/coap-sensors."""
    if args.coap_dir is not None:
        return Path(args.coap_dir)
    config_path = args.config or (str(INSTALLED_CONFIG) if INSTALLED_CONFIG.is_file() else None)
    if config_path is None:
        return COAP_DIR
    config = load_config(config_path)
    coap = config.adapter("coap")
    if coap.oscore_dir:
        return Path(coap.oscore_dir)
    if config.store.data_dir:
        return Path(config.store.data_dir) / OSCORE_DIR
    if Path(config_path) == INSTALLED_CONFIG:  # the installed unit gives its data directory as --data-dir
        return INSTALLED_DATA_DIR / OSCORE_DIR
    raise ConfigError(
        f"{config_path}: the store is in memory and [coap] oscore_dir is not set: the gateway keeps no CoAP "
        "credentials (set one of them, or give --coap-dir)"
    )


def run(args: argparse.Namespace) -> int:
    if args.coap and args.action == "acl":
        print("sepa-gateway sensors: acl is Mosquitto's (MQTT logins), not for --coap", file=sys.stderr)
        return 2
    if args.coap:
        return _run_coap(args)
    if args.action == "allow" and args.patterns:
        print("sepa-gateway sensors: --path is for CoAP sensors (--coap); MQTT logins take --topic", file=sys.stderr)
        return 2
    try:
        if args.action == "list":
            return _print_names(logins(args.password_file))
        if args.action == "acl":
            print(mqtt_acl.write_acl(args.password_file, logins(args.password_file)).read_text(), end="")
        elif args.action == "allow":
            mqtt_acl.allow(args.password_file, logins(args.password_file), args.name, args.topics, args.commands)
            print(f"{args.name} may publish to: {', '.join([*mqtt_acl.own_topics(args.name), *args.topics])}")
            if args.commands:
                print(f"{args.name} may also subscribe to: {', '.join(args.commands)}")
        elif args.action == "remove":
            remove_login(args.password_file, args.name)
            print(f"{args.name}: login removed")
        else:
            password = create_login(args.password_file, args.name, reset=args.reset)
            host = args.host or os.uname().nodename
            print(f"username: {args.name}")
            print(f"password: {password}")
            print(_test_line(args.name, host))
            if args.name != mqtt_acl.GATEWAY_LOGIN:
                own = ", ".join(mqtt_acl.own_topics(args.name))
                print(f"topics:   {own} (others: sepa-gateway sensors allow {args.name} --topic ...)")
        if not args.no_reload:
            print(reload_mosquitto(args.pid_file), file=sys.stderr)
    except PermissionError as error:
        print(f"sepa-gateway sensors: {error.filename}: permission denied (run it with sudo)", file=sys.stderr)
        return 1
    except (LoginError, mqtt_acl.TopicError, OSError, subprocess.SubprocessError) as error:
        print(f"sepa-gateway sensors: {error}", file=sys.stderr)
        return 1
    return 0


def _test_line(name: str, host: str) -> str:
    """How to try the new login with mosquitto_pub, its password read from mosquitto_pub's options
    file (one `-option value` a line, in $XDG_CONFIG_HOME/mosquitto_pub) and typed into `cat`. Why:
    the line printed before, `mosquitto_pub ... -P 'PASSWORD'`, run as printed, left the password
    in `ps` for every user of the machine and in the shell's history; mosquitto_pub reads no
    password from stdin or the environment. The password itself is shown once, on its own line."""
    directory = f"~/.config/sepa-{name}"
    return (
        "test it (the password off the command line, where ps and the shell history keep it):\n"
        f"  mkdir -p -m 700 {directory} && cat > {directory}/mosquitto_pub\n"
        "  -P PASSWORD    <- type this line into cat with the password above, then Enter and Ctrl-D\n"
        f"  XDG_CONFIG_HOME={directory} mosquitto_pub -h {host} -u {name} -t gateway/{name}/temperature -m 21.5"
    )


def _print_names(names: list[str]) -> int:
    """Print one name a line. A reader that leaves early (`sensors list | grep -q NAME`, as the
    installer ran it) is no error: it failed with `[Errno 32] Broken pipe` and exit 1, which under
    `set -o pipefail` sent the installer down the branch that resets the gateway's MQTT password."""
    try:
        for name in names:
            print(name)
        sys.stdout.flush()
    except BrokenPipeError:
        with contextlib.suppress(OSError):  # the flush at exit must not try again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _run_coap(args: argparse.Namespace) -> int:
    """The CoAP side of the command: OSCORE contexts the running gateway picks up within seconds."""
    try:
        directory = coap_directory(args)
    except ConfigError as error:
        print(f"sepa-gateway sensors: {error}", file=sys.stderr)
        return 2
    try:
        if args.action == "list":
            return _print_names(oscore_sensors.sensors(directory))
        if args.action == "remove":
            oscore_sensors.remove_sensor(directory, args.name)
            print(f"{args.name}: CoAP credential removed")
            return 0
        if args.action == "allow":
            oscore_sensors.allow_paths(directory, args.name, args.patterns)
            shown = ", ".join(["s/" + args.name + "/#", *args.patterns])
            print(f"{args.name} may post to: {shown}")
            return 0
        settings = oscore_sensors.create_sensor(directory, args.name, reset=args.reset)
    except PermissionError as error:
        print(f"sepa-gateway sensors: {error.filename}: permission denied (run it with sudo)", file=sys.stderr)
        return 1
    except (oscore_sensors.CredentialError, OSError) as error:
        print(f"sepa-gateway sensors: {error}", file=sys.stderr)
        return 1
    host = args.host or os.uname().nodename
    print(f"sensor: {args.name}")
    print("OSCORE security context of the sensor (RFC 8613; AES-CCM-16-64-128, HKDF-SHA256), shown only once:")
    print(json.dumps(settings, indent=1))
    print(f"test it (aiocoap): save the JSON above as ./{args.name}/settings.json, then")
    print(f"  aiocoap-client --credentials creds.json -m POST --payload 21.5 coap://{host}/s/{args.name}/temperature")
    print(f'  with creds.json: {{"coap://{host}/*": {{"oscore": {{"basedir": "{args.name}/"}}}}}}')
    return 0
