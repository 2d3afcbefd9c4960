"""Structured, quiet logging: one `key=value` line per event, extra fields included."""

from __future__ import annotations

import json
import logging
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


_NEEDS_QUOTES = frozenset(' ="\\\n\r\t')


def _quote(value: object) -> str:
    """A value as one token: quoted, with quotes and line breaks escaped, when it needs it. Why the
    escaping: values can come from clients (a registration's identity, a path), and a line break in
    one must not forge a log line of its own."""
    text = str(value)
    if text and _NEEDS_QUOTES.isdisjoint(text):
        return text
    return json.dumps(text, ensure_ascii=False)


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
