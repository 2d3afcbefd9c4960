"""Which line of a TOML file holds the setting a configuration error names.

Why: an operator who edited /etc/sepa-gateway/sepa-gateway.toml wants ``FILE:LINE: what is wrong``,
as a compiler says it, from the installer and from ``sepa-gateway check-config``, not only the
setting's dotted name. tomllib keeps no positions, and the checks that find a problem (the
appliance's, the plug-ins', the client registry's) name the setting in their one-line message:
``http.port must be ...``, ``unknown setting http.prot``, ``mqtt.mappings[2] (id 'x'): ...``,
``security.clients[0].read: ...``, ``mqtt: host must not be empty``, ``unknown section [htp]``.
So the line is found from that name with a scan of the file's lines that follows its table
headers (``[name]``, ``[[name]]`` counted for the index) and ``key =`` lines; what is not found
(a setting left at its default, a value inside a multi-line array) falls back to its table's
header, and a message naming no setting of the file gets no line.
"""

from __future__ import annotations

import re

_HEADER = re.compile(r"^\s*(\[\[?)\s*([A-Za-z0-9_.-]+)\s*\]\]?")
_KEY = re.compile(r"^\s*([A-Za-z0-9_-]+)\s*=")
# section.key, section.key[2], section.key[2].field; "[section]"; "section: key"
_DOTTED = re.compile(r"\b([a-z][a-z0-9_]*)\.([a-z][a-z0-9_]*)(?:\[(\d+)\])?(?:\.([a-z][a-z0-9_]*))?")
_BRACKETED = re.compile(r"\[([a-z][a-z0-9_]*)\]")
_COLON = re.compile(r"^([a-z][a-z0-9_]*): ([a-z][a-z0-9_]*)")
_TOML_LINE = re.compile(r"\(at line (\d+), column \d+\)")


def toml_error_line(message: str) -> int | None:
    """The line tomllib names in a decoding error's message."""
    found = _TOML_LINE.search(message)
    return int(found.group(1)) if found else None


def setting_line(text: str, message: str) -> int | None:
    """The 1-based line of the first setting named in `message` that `text` holds, else of the first
    named setting's table header, or None."""
    layout = _Layout(text)
    named = [
        (found.group(1), found.group(2), None if found.group(3) is None else int(found.group(3)), found.group(4))
        for found in _DOTTED.finditer(message)
    ]
    colon = _COLON.match(message)
    if colon is not None:
        named.append((colon.group(1), colon.group(2), None, None))
    for exact in (True, False):
        for section, key, index, field in named:
            line = layout.find(section, key, index, field, exact=exact)
            if line is not None:
                return line
    for found in _BRACKETED.finditer(message):
        line = layout.header(found.group(1)) or layout.key(None, found.group(1))
        if line is not None:
            return line
    return None


class _Layout:
    """Where each table header and each key is, by table (its ``[[array]]`` occurrence counted)."""

    def __init__(self, text: str) -> None:
        self.headers: dict[tuple[str, int], int] = {}  # (table, occurrence) -> line
        self.keys: dict[tuple[str | None, int, str], int] = {}  # (table, occurrence, key) -> first line
        counts: dict[str, int] = {}
        table: str | None = None
        occurrence = 0
        for number, line in enumerate(text.splitlines(), start=1):
            header = _HEADER.match(line)
            if header is not None:
                table = header.group(2)
                occurrence = counts.get(table, 0)
                counts[table] = occurrence + 1
                self.headers.setdefault((table, occurrence), number)
                continue
            key = _KEY.match(line)
            if key is not None:
                self.keys.setdefault((table, occurrence, key.group(1)), number)

    def header(self, table: str, occurrence: int = 0) -> int | None:
        return self.headers.get((table, occurrence))

    def key(self, table: str | None, key: str, occurrence: int = 0) -> int | None:
        return self.keys.get((table, occurrence, key))

    def find(self, section: str, key: str, index: int | None, field: str | None, *, exact: bool) -> int | None:
        """`section.key`, or the `index`th `[[section.key]]` (its `field` when given); not `exact`:
        the header of the table that would hold it."""
        if index is not None:
            array = f"{section}.{key}"
            start = self.header(array, index)
            if start is not None:
                found = self.key(array, field, index) if field else None
                return found or (start if not exact or field is None else None)
            return self.key(section, key)  # an inline array: its key's line
        if field is None and self.key(section, key) is not None:
            return self.key(section, key)
        if exact or not self._known(section):
            return None
        return self.header(f"{section}.{key}") or self.header(section)

    def _known(self, section: str) -> bool:
        return any(table == section or table.startswith(f"{section}.") for table, _ in self.headers)
