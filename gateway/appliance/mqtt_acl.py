"""Mosquitto's access control list for the installed broker: a sensor login publishes its own topics only.

Why: with a password file alone, every login may publish and subscribe to every topic. A password
taken from one sensor (they sit in plain text in devices on the plant-room wall) could then forge
the readings of every other sensor and publish straight to the actuators' command topics
(`cmnd/<lamp>/POWER`, Homie `.../set`), past the gateway and its rights. With this file:

- each sensor login writes the topics of its own device in the ready-made conventions (its login
  is the device name: `gateway/<login>/...`, `homie/5/<login>/...`, `tele/<login>/...`,
  `stat/<login>/...`, `zigbee2mqtt/<login>`, `senml/<login>`) and reads only its own command
  topics (`cmnd/<login>/...`, `homie/5/<login>/<node>/<property>/set`);
- topics of your own mappings are granted per login (`sepa-gateway sensors allow NAME --topic
  PATTERN`, `--commands PATTERN` for reading), and kept in this file;
- the gateway's own login (`sepa-gateway`, made by the installer) reads and writes everything.

The file is always written whole from the password file's logins and the grants already in it, so
it never names a login that no longer exists; Mosquitto reads it again on the same SIGHUP as the
password file. Topic patterns are checked before they are written: no whitespace or control
character (a newline would add a line of its own to the file), no `%` (Mosquitto's substitutions),
`+` and `#` as whole levels only.
"""

from __future__ import annotations

import re
from pathlib import Path

from broker.api import write_file

GATEWAY_LOGIN = "sepa-gateway"  # the gateway's own login (systemd/install.sh)
OWN_TOPICS = (
    ("write", "gateway/%u/#"),
    ("write", "homie/5/%u/#"),
    ("read", "homie/5/%u/+/+/set"),
    ("write", "tele/%u/#"),
    ("write", "stat/%u/#"),
    ("read", "cmnd/%u/#"),
    ("write", "zigbee2mqtt/%u"),
    ("write", "senml/%u"),
)
ACCESS = ("write", "read")  # what `allow` grants: publish readings, or subscribe to commands
HEADER = """\
# Written by `sepa-gateway sensors` at every change of the logins: change it with
# `sepa-gateway sensors allow NAME --topic PATTERN` (publish) or `--commands PATTERN` (subscribe).
# Every login publishes its own device's topics and reads its own commands (%u: the login):
"""
_TOPIC_LINE = re.compile(r"topic (read|write) (\S+)")


class TopicError(Exception):
    """A topic pattern that cannot be granted (said in one line)."""


def acl_file(password_file: Path) -> Path:
    """The ACL file kept beside `password_file` (sepa-gateway.passwd -> sepa-gateway.acl); the same
    rule as systemd/mosquitto-conf.sh, which names it in Mosquitto's configuration."""
    return password_file.with_name(password_file.name.removesuffix(".passwd") + ".acl")


def own_topics(login: str) -> list[str]:
    """The topics `login` may publish to without a grant (its own device's)."""
    return [topic.replace("%u", login) for access, topic in OWN_TOPICS if access == "write"]


def topic_problem(pattern: str) -> str:
    """Why `pattern` cannot be granted, or "" when it can."""
    if not pattern or len(pattern) > 256:
        return "a topic pattern is 1-256 characters"
    if any(character.isspace() or not character.isprintable() for character in pattern) or "%" in pattern:
        return "a topic pattern has no whitespace, control characters or %"
    levels = pattern.split("/")
    if "#" in levels[:-1] or any(("#" in level or "+" in level) and level not in ("#", "+") for level in levels):
        return "in a topic pattern, + and # stand for whole levels, and # only last"
    if pattern.startswith("$"):
        return "a topic pattern starting with $ is the broker's own"
    return ""


def grants(path: Path) -> dict[str, list[tuple[str, str]]]:
    """The per-login grants in an ACL file written here: {login: [(access, pattern)]}."""
    found: dict[str, list[tuple[str, str]]] = {}
    user = None
    if not path.exists():
        return found
    for line in path.read_text().splitlines():
        if line.startswith("user "):
            user = line.removeprefix("user ").strip()
            found.setdefault(user, [])
        elif user is not None and (match := _TOPIC_LINE.fullmatch(line.strip())) and not topic_problem(match[2]):
            found[user].append((match[1], match[2]))
    return found


def render(logins: list[str], granted: dict[str, list[tuple[str, str]]]) -> str:
    """The ACL file's text for `logins` (the password file's), with their `granted` topics."""
    lines = [HEADER.rstrip("\n"), *(f"pattern {access} {topic}" for access, topic in OWN_TOPICS)]
    if GATEWAY_LOGIN in logins:
        lines += ["", "# the gateway's own login", f"user {GATEWAY_LOGIN}", "topic readwrite #"]
    for login in sorted(set(logins) - {GATEWAY_LOGIN}):
        extra = sorted(set(granted.get(login, ())))
        if extra:
            lines += ["", f"user {login}", *(f"topic {access} {topic}" for access, topic in extra)]
    return "\n".join(lines) + "\n"


def write_acl(password_file: Path, logins: list[str], granted: dict[str, list[tuple[str, str]]] | None = None) -> Path:
    """Write the ACL file of `password_file` for `logins`, keeping the grants already in it unless
    `granted` replaces them; atomically, owned and moded like the password file (Mosquitto reads both)."""
    path = acl_file(password_file)
    text = render(logins, grants(path) if granted is None else granted)
    model = password_file.stat() if password_file.exists() else None
    mode = model.st_mode & 0o777 if model is not None else 0o600
    owner = (model.st_uid, model.st_gid) if model is not None else None
    write_file(path, text.encode(), mode, owner)  # never through a symlink at its name (root runs this)
    return path


def allow(password_file: Path, logins: list[str], name: str, topics: list[str], commands: list[str]) -> Path:
    """Grant login `name` exactly these extra `topics` (publish) and `commands` (subscribe): the
    grants replace the ones it had; none left means its own device's topics only."""
    if name not in logins:
        raise TopicError(f"no login {name!r} (sepa-gateway sensors add {name} makes one)")
    if name == GATEWAY_LOGIN:
        raise TopicError(f"{GATEWAY_LOGIN!r} is the gateway's own login: it has every topic")
    for pattern in (*topics, *commands):
        problem = topic_problem(pattern)
        if problem:
            raise TopicError(f"{pattern!r}: {problem}")
    granted = grants(acl_file(password_file))
    granted[name] = [("write", topic) for topic in topics] + [("read", topic) for topic in commands]
    return write_acl(password_file, logins, granted)
