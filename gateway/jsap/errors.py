"""The one error of the JSAP layer.

A JSAP file is written by hand and read by machines, so every error names the member at fault as
a dotted path (`queries.RECEIVED.forcedBindings.sender.type`): the author can go straight to it,
and callers can test `error.path` instead of parsing the message.
"""

from __future__ import annotations


class JsapError(ValueError):
    """A malformed JSAP, or a forced binding that cannot be written safely.

    `path` is the member at fault (empty for the document itself), `detail` what is wrong with it;
    the message is `"<path>: <detail>"`. A ValueError so that callers treating bad input generally
    need not import this class.
    """

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"{path}: {detail}" if path else detail)
        self.path = path
        self.detail = detail
