"""Sensor credentials for CoAP: OSCORE security contexts (RFC 8613), one per sensor, in a directory.

Here, not in adapters/coap, because `sepa-gateway sensors` (the one CLI of sensor credentials, MQTT
logins too) makes them; the CoAP adapter loads them (adapters/coap/credentials.py).

Why OSCORE and not DTLS: aiocoap's DTLS server needs DTLSSocket, which has no wheels and builds
from source with autotools and a C compiler (it fails on a stock Debian: no autoreconf), and aiocoap
calls that server "highly experimental and incomplete", bound to a single address. aiocoap's OSCORE
is maintained and pure Python over `cryptography` (plus lakers for EDHOC, which it imports): it
protects each request end to end, and works through proxies and over plain UDP on port 5683, so a
sensor needs no second port. libcoap's coap-client speaks OSCORE from libcoap 4.3.2 (`-E`); Debian 12
ships 4.3.1, so on this Debian the plain coap-client is for this board (loopback) only.

Layout: `<dir>/<sensor>/settings.json` (aiocoap's security context file: the gateway's sender ID,
the sensor's as recipient ID, a 16-byte master secret and an 8-byte salt) and aiocoap's own
`sequence.json` beside it (sequence numbers, kept across restarts so no nonce is used twice).
Sender IDs are 6 random bytes (OSCORE IDs are at most 7 bytes with AES-CCM-16-64-128): the sensor's
ID names its context in every request (the OSCORE `kid`), its name names it in the logs and claims.

What a sensor may post to: its own resources, `s/<sensor>` and below, and the path patterns in
`paths.json` beside its context (`sepa-gateway sensors allow NAME --coap --path PATTERN...`; `+` is one path
segment, `#` the rest). Why: a sensor's key lives in a cheap device on the network; one taken from a
device must not let its holder write every other sensor's readings (a forged boiler temperature is an
actuator command away from a real valve).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import stat
from pathlib import Path
from typing import Any

from broker.api import directory_owner, make_directories, open_directory, write_file

OSCORE_DIR = "coap-sensors"  # in the data directory, unless [coap] oscore_dir says otherwise
PATHS_FILE = "paths.json"  # the sensor's extra path patterns, beside its context
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
GATEWAY_ID = "00"  # the gateway's sender ID in every context: contexts differ by their secrets


class CredentialError(Exception):
    """A sensor credential cannot be made or removed (said in one line)."""


def sensors(directory: Path) -> list[str]:
    """The sensors with a security context in `directory`."""
    if not directory.is_dir():
        return []
    return sorted(
        entry.name
        for entry in directory.iterdir()
        if NAME.fullmatch(entry.name) and (entry / "settings.json").is_file()
    )


def create_sensor(directory: Path, name: str, *, reset: bool = False) -> dict[str, Any]:
    """Make the security context of sensor `name`; returns the sensor's side of it (its settings).

    The directory (and its missing parents) and the context are 0700 / 0600 and owned like the
    nearest directory above that exists (the service's: the gateway must write the sequence
    numbers). The context is written
    in a hidden folder and renamed into place, so the running gateway, which reloads when the
    directory changes, never sees a folder without its settings (under load it did, and then
    never looked again). On disk once it returns (settings.json, the folder, the rename synced):
    the command prints the sensor's key once, and before, with nothing synced (strace: the rename
    alone), a power cut in the next seconds lost the context, or left settings.json empty, after
    the key had been given to the sensor (then refused, or the gateway's reload failed on it).
    """
    if not NAME.fullmatch(name):
        raise CredentialError("a sensor name is 1-64 characters: letters, digits and . _ - (not first)")
    folder = directory / name
    if folder.exists() and not reset:
        raise CredentialError(f"{name!r} already has a CoAP credential (--reset gives it a new one)")
    taken = {_recipient(directory / other) for other in sensors(directory) if other != name}
    sensor_id = secrets.token_hex(6)
    while sensor_id in taken:
        sensor_id = secrets.token_hex(6)
    secret, salt = secrets.token_hex(16), secrets.token_hex(8)
    make_directories(directory)
    settings = {"sender-id_hex": GATEWAY_ID, "recipient-id_hex": sensor_id, "secret_hex": secret, "salt_hex": salt}
    # Every name below is opened relative to the directory's descriptor, without following a
    # symlink, and owned by fchown: root runs this in a directory the service user owns, who could
    # otherwise swap a name for a link between two calls and have root chown or write its target.
    with open_directory(directory) as base:
        owner = directory_owner(base)
        making = f".{name}.new"
        _remove(making, base)
        os.mkdir(making, 0o700, dir_fd=base)
        with open_directory(making, at=base) as folder_descriptor:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            with os.fdopen(os.open("settings.json", flags, 0o600, dir_fd=folder_descriptor), "w") as out:
                _give(out.fileno(), owner)
                json.dump(settings, out, indent=1)
                out.flush()
                os.fsync(out.fileno())
            _give(folder_descriptor, owner)
            os.fsync(folder_descriptor)
        _remove(name, base)
        os.rename(making, name, src_dir_fd=base, dst_dir_fd=base)
        os.fsync(base)
    return {"sender-id_hex": sensor_id, "recipient-id_hex": GATEWAY_ID, "secret_hex": secret, "salt_hex": salt}


def allow_paths(directory: Path, name: str, patterns: list[str]) -> None:
    """Let sensor `name` post to `patterns` besides its own resources (none: only its own).

    Written beside the sensor's context and renamed into place: the running gateway reads it
    within seconds, whole."""
    folder = directory / name
    if not NAME.fullmatch(name) or not (folder / "settings.json").is_file():
        raise CredentialError(f"no CoAP credential {name!r}")
    for pattern in patterns:
        problem = pattern_problem(pattern)
        if problem:
            raise CredentialError(f"{pattern!r}: {problem}")
    # not through a symlink the service user put there (it owns the folder; root runs this)
    write_file(folder / PATHS_FILE, json.dumps(sorted(set(patterns))).encode(), 0o600)


def allowed_paths(folder: Path) -> tuple[str, ...]:
    """The extra path patterns in a sensor's folder (none when absent or unreadable)."""
    try:
        patterns = json.loads((folder / PATHS_FILE).read_text())
    except (OSError, ValueError):
        return ()
    if not isinstance(patterns, list):
        return ()
    return tuple(p for p in patterns if isinstance(p, str) and not pattern_problem(p))


def pattern_problem(pattern: str) -> str:
    """Why `pattern` is not a path pattern, or "" (segments separated by /, + one, # the rest)."""
    if not pattern or pattern.startswith("/") or len(pattern) > 512:
        return "a path pattern is 1-512 characters, without a leading /"
    segments = pattern.split("/")
    if "#" in segments[:-1] or any(("#" in s or "+" in s) and s not in ("#", "+") for s in segments):
        return "+ and # stand for whole segments, and # only last"
    return ""


def may_post(name: str, patterns: tuple[str, ...], path: str) -> bool:
    """Whether sensor `name` may post a reading to `path` (its own `s/<name>` resources, or a pattern)."""
    if path == f"s/{name}" or path.startswith(f"s/{name}/"):
        return True
    segments = path.split("/")
    return any(_matches(pattern.split("/"), segments) for pattern in patterns)


def _matches(pattern: list[str], segments: list[str]) -> bool:
    for index, part in enumerate(pattern):
        if part == "#":
            return True
        if index >= len(segments) or (part != "+" and part != segments[index]):
            return False
    return len(pattern) == len(segments)


def remove_sensor(directory: Path, name: str) -> None:
    if not NAME.fullmatch(name) or not (directory / name / "settings.json").is_file():
        raise CredentialError(f"no CoAP credential {name!r}")
    shutil.rmtree(directory / name)


def credentials(directory: Path) -> dict[str, Any]:
    """aiocoap's credentials map for the server: `:<sensor>` -> its context directory."""
    return {f":{name}": {"oscore": {"basedir": str(directory / name) + "/"}} for name in sensors(directory)}


def _recipient(folder: Path) -> str:
    try:
        return str(json.loads((folder / "settings.json").read_text())["recipient-id_hex"])
    except (OSError, ValueError, KeyError):
        return ""


def _give(descriptor: int, owner: tuple[int, int] | None) -> None:
    """Own the open file or directory as `owner` when root (the service must write sequence numbers)."""
    if owner is not None and os.geteuid() == 0:
        os.fchown(descriptor, *owner)


def _remove(name: str, base: int) -> None:
    """Remove `name` in directory descriptor `base`: a folder with its content, anything else
    (a symlink included, never followed) by unlinking it; nothing when it is absent."""
    try:
        status = os.lstat(name, dir_fd=base)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(status.st_mode):
        shutil.rmtree(name, dir_fd=base)
    else:
        os.unlink(name, dir_fd=base)
