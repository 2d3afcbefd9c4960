"""Bearer tokens of the landing endpoint: where they come from and how a presented one is checked.

Why every accepted token is compared, with :func:`hmac.compare_digest`, even after a match: an early
exit or ``==`` lets response times tell an attacker how much of a guess was right, or which of the
tokens it was close to. Tokens never reach a log line or an error message.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from pathlib import Path

TOKENS_ENV = "SEPA_CLOUD_TOKENS"


class TokenError(ValueError):
    """The accepted tokens cannot be loaded (unreadable file, none at all)."""


def load_tokens(token_file: str | None, environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """Accepted tokens: ``token_file`` (one per line, blank lines and ``#`` comments ignored) plus the
    comma-separated :data:`TOKENS_ENV`. Refuses an empty set: an endpoint nobody can use is a mistake."""
    tokens: list[str] = []
    if token_file is not None:
        try:
            text = Path(token_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise TokenError(f"cannot read the token file {token_file}: {error}") from error
        tokens += [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    tokens += [token.strip() for token in environ.get(TOKENS_ENV, "").split(",") if token.strip()]
    bad = [index for index, token in enumerate(tokens) if any(char.isspace() for char in token)]
    if bad:
        raise TokenError(f"token number {bad[0] + 1} holds white space (a token is one word)")
    if not tokens:
        raise TokenError(f"no accepted tokens: give --token-file or set {TOKENS_ENV}")
    return tuple(dict.fromkeys(tokens))


class BearerCheck:
    """Checks an ``Authorization`` header against the accepted tokens in constant time."""

    def __init__(self, tokens: tuple[str, ...]) -> None:
        self._tokens = tuple(token.encode("utf-8") for token in tokens)

    def __repr__(self) -> str:
        return f"BearerCheck({len(self._tokens)} tokens)"

    def accepts(self, authorization: str | None) -> bool:
        """True when the header is ``Bearer <token>`` with one of the accepted tokens."""
        if not authorization:
            return False
        scheme, _, presented = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        candidate = presented.strip().encode("utf-8", "surrogateescape")
        matched = False
        for token in self._tokens:
            matched |= hmac.compare_digest(candidate, token)
        return matched
