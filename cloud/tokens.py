"""Bearer tokens of the landing endpoint: where they come from, which gateway each may write for, and
how a presented one is checked.

An entry is ``<gateway-slug>:<token>`` (bound: the token may only PUT that gateway's batches) or a
bare ``<token>`` (unbound: any batch id, as before bindings existed). The slug is the gateway part of
the shipper's batch ids (:meth:`gateway.shipper.spool.Spool.batch_id`: ``[observations] gateway_id``,
the host name by default, with characters outside ``[A-Za-z0-9._-]`` turned into ``-``), so it never
holds a ``:`` and the entry is split at the first one.

Why bound: batch ids are predictable (``<slug>-<spool id>-<segment number>``, the spool id is in every
id the gateway sent), so any token holder could PUT a victim gateway's next ids first; the victim's
real segment then got 409, which its shipper takes as final, and its observations were lost.

Why every accepted token is compared, with :func:`hmac.compare_digest`, even after a match: an early
exit or ``==`` lets response times tell an attacker how much of a guess was right, or which of the
tokens it was close to. Tokens never reach a log line or an error message (neither does the part of
an entry before its ``:``, in case an old token holds one).
"""

from __future__ import annotations

import hmac
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

TOKENS_ENV = "SEPA_CLOUD_TOKENS"
GATEWAY_SLUG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""What a token's gateway may be (full match): what the shipper's batch ids start with."""


class TokenError(ValueError):
    """The accepted tokens cannot be loaded (unreadable file, none at all, a malformed entry)."""


@dataclass(frozen=True, eq=False)
class Credential:
    """One accepted token and the gateway it is bound to (None: unbound). Compared and hashed by
    identity (``eq=False``), so a dict keyed by credentials never hashes or compares a token."""

    secret: bytes = field(repr=False)
    gateway: str | None = None

    def may_write(self, batch_id: str) -> bool:
        """True when this token may PUT ``batch_id``: unbound, or the id is its gateway's."""
        return self.gateway is None or batch_gateway(batch_id) == self.gateway


def batch_gateway(batch_id: str) -> str | None:
    """The gateway part of a batch id shaped ``<slug>-<spool id>-<segment number>``, or None.

    Split at the last two ``-``: a slug may hold ``-`` itself, the other two parts never do, so gateway
    ``gw`` does not own ``gw-2-0a1b2c3d-000000000001`` (gateway ``gw-2``'s)."""
    parts = batch_id.rsplit("-", 2)
    if len(parts) != 3 or not all(parts):
        return None
    return parts[0]


def parse_tokens(entries: tuple[str, ...]) -> tuple[Credential, ...]:
    """The credentials of the accepted entries; :class:`TokenError` names a bad one by its number only."""
    credentials: list[Credential] = []
    bindings: dict[bytes, tuple[int, str | None]] = {}
    for number, entry in enumerate(entries, start=1):
        credential = _credential(number, entry)
        earlier = bindings.setdefault(credential.secret, (number, credential.gateway))
        if earlier[1] != credential.gateway:
            raise TokenError(f"token number {number} is token number {earlier[0]} again, bound otherwise")
        if earlier[0] == number:
            credentials.append(credential)
    return tuple(credentials)


def _credential(number: int, entry: str) -> Credential:
    gateway, colon, secret = entry.partition(":")
    if not colon:
        return Credential(entry.encode("utf-8"))
    if not GATEWAY_SLUG.fullmatch(gateway):
        raise TokenError(
            f"token number {number}: the part before ':' is not a gateway as batch ids spell it "
            f"({GATEWAY_SLUG.pattern}; write <gateway-slug>:<token>)"
        )
    if not secret:
        raise TokenError(f"token number {number}: no token after its gateway")
    return Credential(secret.encode("utf-8"), gateway)


def load_tokens(token_file: str | None, environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """Accepted entries: ``token_file`` (one per line, blank lines and ``#`` comments ignored) plus the
    comma-separated :data:`TOKENS_ENV`. Refuses an empty set (an endpoint nobody can use is a mistake)
    and malformed entries (see :func:`parse_tokens`)."""
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
    entries = tuple(dict.fromkeys(tokens))
    parse_tokens(entries)
    return entries


class BearerCheck:
    """Finds the credential of an ``Authorization`` header among the accepted ones in constant time."""

    def __init__(self, entries: tuple[str, ...]) -> None:
        self._credentials = parse_tokens(entries)

    def __repr__(self) -> str:
        return f"BearerCheck({len(self._credentials)} tokens, {self.unbound} unbound)"

    @property
    def unbound(self) -> int:
        """How many accepted tokens may write any gateway's batches."""
        return sum(credential.gateway is None for credential in self._credentials)

    def match(self, authorization: str | None) -> Credential | None:
        """The credential of a ``Bearer <token>`` header, or None when it is no accepted token."""
        if not authorization:
            return None
        scheme, _, presented = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            return None
        candidate = presented.strip().encode("utf-8", "surrogateescape")
        matched: Credential | None = None
        for credential in self._credentials:  # every one, no early exit (see the module docstring)
            if hmac.compare_digest(candidate, credential.secret):
                matched = credential
        return matched
