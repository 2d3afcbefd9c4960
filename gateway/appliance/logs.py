"""Structured, quiet logging: one `key=value` line per event, extra fields included.

Where the lines go: stderr, unless a log file is configured (``[logging] file``, ``run --log-file``),
and then to that file, rotated (:class:`logging.handlers.RotatingFileHandler`: at ``file_max_bytes``
the file becomes ``FILE.1``, and ``file_backups`` old files are kept), so that a gateway started
without systemd (a container: systemd/install.sh runs it in the background) cannot fill the disk
with its log. Under systemd stderr goes to the journal, which rotates by itself and which
``journalctl -u sepa-gateway`` reads: there the file is ignored. systemd says so in
``JOURNAL_STREAM`` (``device:inode`` of the stream it connected to stderr); we check that it is
still our stderr, not only that the variable is set (a shell started from a service inherits it)
nor that ``INVOCATION_ID`` is (a unit may send stderr elsewhere).
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import re
import sys

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields.update({key: value for key, value in vars(record).items() if key not in _STANDARD})
        line = " ".join(f"{key}={_quote(value)}" for key, value in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


# characters that make a value quoted: separators, and every control or invisible character
_NEEDS_QUOTES = re.compile(r'[\x00-\x20"=\\\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]')
# what json.dumps leaves as it is among them: DEL, C1 controls (NEL), line and paragraph separators,
# bidirectional overrides, unpaired surrogates
_ESCAPED_AS_WELL = re.compile(r"[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _quote(value: object) -> str:
    """A value as one token: quoted, with quotes, line breaks and every control character escaped,
    when it needs it. Why the escaping: values can come from clients (a registration's identity, a
    path); a line break in one must not forge a log line of its own, and an ESC sequence (or NEL,
    U+2028, a bidi override) must not redraw or reorder what an operator reads in a terminal."""
    text = str(value)
    if text and not _NEEDS_QUOTES.search(text):
        return text
    return _ESCAPED_AS_WELL.sub(lambda match: f"\\u{ord(match.group()):04x}", json.dumps(text, ensure_ascii=False))


def under_journald() -> bool:
    """Whether stderr is the journal's stream that systemd connected (``JOURNAL_STREAM``)."""
    stream = os.environ.get("JOURNAL_STREAM", "")
    device, _, inode = stream.partition(":")
    if not (device.isdigit() and inode.isdigit()):
        return False
    try:
        status = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):  # no stderr at all
        return False
    return (status.st_dev, status.st_ino) == (int(device), int(inode))


def setup_logging(level: str, file: str = "", max_bytes: int = 10 << 20, backups: int = 5) -> str:
    """Log at `level` to stderr, or to `file` rotated at `max_bytes` with `backups` old files kept
    (not under journald: see the module's docstring); returns where the lines go. Raises OSError
    when the file cannot be opened."""
    handler: logging.Handler
    if file and not under_journald():
        handler = logging.handlers.RotatingFileHandler(file, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
        where = file
    else:
        handler = logging.StreamHandler(sys.stderr)
        where = "journald" if under_journald() else "stderr"
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # its warnings quote what a client sent (a WebSocket upgrade's protocols that match none: ~9.7 KB
    # a line, 300 unauthenticated upgrades wrote 2.9 MB in 0.8 s); the gates count their refusals
    logging.getLogger("aiohttp.websocket").setLevel(logging.ERROR)
    return where
