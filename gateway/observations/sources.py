"""Source filters with named captures, and IRI templates filled from them.

A source is where a reading came from, as slash-separated levels: an MQTT topic, or the path of a
CoAP resource. The filter language is MQTT's, the one sensor people know, and serves every adapter:
`+` matches one level, `#` the rest; a level may also be a capture: `{name}` matches one level (like
`+`) and `{name+}` the rest of the topic (like `#`, last level only). Captured text comes from the
network, so it enters an IRI only percent-encoded (RFC 3986 unreserved characters stay, every
other UTF-8 byte becomes %XX; `/` is kept between the levels of a `{name+}` capture): whatever the
topic, a filled template is a valid IRI with exactly the static parts the mapping wrote.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import quote

from gateway.observations.errors import MappingError, PayloadError

_CAPTURE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(\+?)\}")
# What an MQTT broker refuses in a UTF-8 string (MQTT 5 1.5.4; Mosquitto's mosquitto_validate_utf8):
# control characters, surrogates, non-characters. A filter holding one got the gateway's connection
# dropped as "malformed", with every other filter of the same SUBSCRIBE: all readings stopped.
_REFUSED_BY_BROKERS = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\ufdd0-\ufdef\ufffe\uffff]")


def unsendable(text: str) -> str | None:
    """The first character of `text` an MQTT broker refuses in a topic, or None."""
    found = _REFUSED_BY_BROKERS.search(text)
    if found is not None:
        return found.group()
    return next((char for char in text if ord(char) & 0xFFFE == 0xFFFE), None)  # U+1FFFE...


# What a captured name may be, whatever gave it (a topic level, a Tasmota object, a SenML record):
# at most MAX_NAME_BYTES of UTF-8, and no '.' or '..' segment. Kept verbatim in an IRI, a dot
# segment names another sensor to anything downstream that normalises paths (RFC 3986 §5.2.4):
# `tasmota/boiler/../kitchen/AM2301` is kitchen's; 60 KB names each became a sensor IRI.
MAX_NAME_BYTES = 256
DOT_SEGMENTS = frozenset({".", ".."})


def name_problem(text: str) -> str | None:
    """Why `text` cannot name a sensor, feature or property (a PayloadError's message), or None."""
    if len(text) > MAX_NAME_BYTES // 4 and len(text.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"a name is longer than {MAX_NAME_BYTES} bytes"
    if "." in text and DOT_SEGMENTS.intersection(text.split("/")):
        return "a name may not have a '.' or '..' segment"
    return None


_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
BUILTIN_CAPTURES = ("topic",)


class SourceFilter:
    """One compiled filter: `match(topic)` gives the captures (a dict) or None."""

    __slots__ = ("text", "levels", "captures", "subscription", "_rest", "_fixed")

    def __init__(self, text: str) -> None:
        if not text:
            raise MappingError("a topic filter cannot be empty")
        refused = unsendable(text)
        if refused is not None:
            raise MappingError(f"topic filter {text!r} contains {refused!r}, which MQTT brokers refuse")
        self.text = text
        levels = text.split("/")
        captures: list[str] = []
        subscription: list[str] = []
        # Per level: (literal text or None for a wildcard, capture name or None).
        self._fixed: list[tuple[str | None, str | None]] = []
        self._rest: str | None = None  # "" for `#`, the name for `{name+}`, None when the length is exact
        for index, level in enumerate(levels):
            last = index == len(levels) - 1
            capture = _CAPTURE.fullmatch(level)
            if capture is not None:
                name, rest = capture.groups()
                if name in captures or name in BUILTIN_CAPTURES:
                    raise MappingError(f"topic filter {text!r}: capture {{{name}}} is used twice or is reserved")
                captures.append(name)
                if rest:
                    if not last:
                        raise MappingError(f"topic filter {text!r}: {{{name}+}} must be the last level")
                    self._rest = name
                    subscription.append("#")
                else:
                    self._fixed.append((None, name))
                    subscription.append("+")
                continue
            if level == "#":
                if not last:
                    raise MappingError(f"topic filter {text!r}: '#' must be the last level")
                self._rest = ""
            elif level == "+":
                self._fixed.append((None, None))
            elif any(char in level for char in "+#{}"):
                raise MappingError(
                    f"topic filter {text!r}: level {level!r} mixes text with a wildcard or capture "
                    "(a wildcard or {{name}} must be a whole level)"
                )
            else:
                self._fixed.append((level, None))
            subscription.append(level)
        self.levels = levels
        self.captures = tuple(captures)
        self.subscription = "/".join(subscription)

    def match(self, topic: str) -> dict[str, str] | None:
        """The captures when `topic` matches (MQTT rules: `$` topics need a literal first level)."""
        parts = topic.split("/")
        fixed = self._fixed
        if len(parts) < len(fixed) or (self._rest is None and len(parts) != len(fixed)):
            return None
        if self._rest is not None and self._rest and len(parts) == len(fixed):
            return None  # a named rest capture needs at least one level
        if topic.startswith("$") and (not fixed or fixed[0][0] is None):
            return None
        found: dict[str, str] = {}
        for part, (literal, name) in zip(parts, fixed, strict=False):
            if literal is not None:
                if part != literal:
                    return None
            elif name is not None:
                if not part:
                    return None  # an empty level would mint an IRI that names nothing
                found[name] = part
        if self._rest:
            rest = parts[len(fixed) :]
            if not all(rest):
                return None
            found[self._rest] = "/".join(rest)
        return found

    @property
    def first_literal(self) -> str | None:
        """The first level when it is literal text: the Mapper indexes filters by it."""
        if not self._fixed and self._rest is not None:
            return None
        first = self._fixed[0][0] if self._fixed else None
        return first


def covers(outer: str, inner: str) -> bool:
    """Whether every topic MQTT filter `inner` matches also matches filter `outer` (neither shared)."""
    a, b = outer.split("/"), inner.split("/")
    if b[0].startswith("$") and a[0] in ("+", "#"):
        return False  # a wildcard first level matches no `$` topic
    for index, level in enumerate(a):
        if level == "#":
            return True  # the rest, and the parent level itself ("a/#" matches "a")
        if index >= len(b) or b[index] == "#":
            return False
        if level != "+" and level != b[index]:
            return False
    return len(a) == len(b)


def uncovered(filters: list[str]) -> list[str]:
    """`filters` without those another one covers (of two that cover each other, the first stays).
    Why: a broker delivers one copy of a message per matching subscription (Mosquitto does), so a
    config mapping for `gateway/boiler/temperature` beside the profile's `gateway/+/+` stored every
    message twice. Subscribed once, the message is mapped once, by the first mapping that matches.
    Shared subscriptions (`$share/...`) stay as they are. Cost: each filter against the wildcard
    filters of its first level (or of a wildcard first level)."""
    wild: dict[str | None, list[tuple[int, str]]] = {}
    for index, text in enumerate(filters):
        levels = text.split("/")
        if not text.startswith("$share/") and ("+" in levels or "#" in levels):
            first = levels[0]
            wild.setdefault(None if first in ("+", "#") else first, []).append((index, text))
    kept = []
    for index, text in enumerate(filters):
        if not text.startswith("$share/"):
            candidates = [*wild.get(text.split("/", 1)[0], ()), *wild.get(None, ())]
            if any(
                other != index and covers(outer, text) and (other < index or not covers(text, outer))
                for other, outer in candidates
            ):
                continue
        kept.append(text)
    return kept


def encode(text: str) -> str:
    """Captured text for an IRI: percent-encoded except unreserved characters and `/`."""
    return quote(text, safe="/", errors="strict")


class Template:
    """An IRI template such as `urn:sepa-gateway:sensor:zigbee2mqtt/{device}`, checked once."""

    __slots__ = ("text", "names", "_parts")

    def __init__(self, text: str, available: tuple[str, ...], what: str) -> None:
        self.text = text
        parts: list[tuple[bool, str]] = []
        position = 0
        for placeholder in _PLACEHOLDER.finditer(text):
            name = placeholder.group(1)
            if name not in available and name not in BUILTIN_CAPTURES:
                known = ", ".join(f"{{{n}}}" for n in (*available, *BUILTIN_CAPTURES))
                raise MappingError(f"{what} {text!r} uses {{{name}}}, which is not one of {known}")
            parts.append((False, text[position : placeholder.start()]))
            parts.append((True, name))
            position = placeholder.end()
        parts.append((False, text[position:]))
        if any("{" in part or "}" in part for is_name, part in parts if not is_name):
            raise MappingError(f"{what} {text!r} has an unbalanced '{{' or '}}'")
        self._parts = tuple(part for part in parts if part[0] or part[1])
        self.names = tuple(part for is_name, part in self._parts if is_name)

    def fill(self, values: Mapping[str, str], *, encoded: bool = True) -> str:
        """The template with each `{name}` replaced (percent-encoded unless `encoded` is False);
        PayloadError for a value no name may be (:func:`name_problem`), whatever captured it."""
        out = []
        for is_name, part in self._parts:
            if is_name:
                value = values[part]
                problem = name_problem(value)
                if problem is not None:
                    shown = value if len(value) <= 64 else value[:64] + "..."
                    raise PayloadError(f"{{{part}}} {shown!r}: {problem}")
                out.append(encode(value) if encoded else value)
            else:
                out.append(part)
        return "".join(out)
