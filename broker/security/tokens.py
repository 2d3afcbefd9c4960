"""JWT access tokens of the secure gates, issued and checked through pyjwt (PROTOCOL.md "OAuth 2.0").

A token is an ES256 JWT with ``iss`` (this gateway), ``sub`` (the client_id of a registration),
``iat``, ``exp`` and a random ``jti``. Checking pins the algorithm list to ES256, so an unsigned
token (``alg: none``) and the classic algorithm confusion (an HS256 token "signed" with the public
key as HMAC secret) are refused by pyjwt itself, as are forged signatures, wrong issuers, expired
tokens and tokens missing a required claim. Every such token is the same 401 ``invalid_grant``.

Why a cache of verified tokens: an ECDSA verification costs ~230 us (measured with pyjwt 2.15 on
the 2-core development machine), more than a whole small update. A token string that verified
once verifies again until it expires, so the cache keeps the decoded claims (bounded, oldest
evicted) and re-checks only the expiry; whether its client is still registered and not revoked is
checked on every request by the caller.

Why revocation of one token (RFC 7009, :meth:`TokenAuthority.revoke`): a token is good until it
expires (an hour by default), and a dashboard's logout only forgot it in the browser, so a copy
(a shared machine, a proxy's log) stayed good. A revoked token's ``jti`` is kept until it expires,
at most REVOKED_PER_CLIENT a client; past that, every token of that client issued until then is
refused (its ``iat`` is not after the client's cut-off), and its list starts again. Kept on disk
too (broker.security.revocations): :meth:`TokenAuthority.restore` takes them back at start, and
:attr:`TokenAuthority.kept` is what the file is rewritten from; before 2026-12-07 a restart forgot
them and the revoked tokens lived to their expiry.

Why :meth:`TokenAuthority.revoked` and :meth:`TokenAuthority.clients_revoked`: a WSS subscription
keeps the ``jti`` and ``iat`` of the token it was made with (broker.security.authority Principal),
and the secure gates' revocation watch ends those whose token a revocation names (or a cut-off
covers), looking only at the clients that revoked a token since its last look. Nothing more is
kept per token than the list above; the clients since the last look are registered ones.

Why :meth:`TokenAuthority.revoke` says what it revoked (:class:`Revoked`): a delayed update keeps
the ``jti`` and ``iat`` of the token it was scheduled with, and the secure gates drop those of the
token (or of every token the new cut-off covers) before they answer the revocation
(broker.delayed, "Revoked tokens").
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec

from broker.errors import Unauthorized
from broker.security.revocations import Kept

ALGORITHM = "ES256"
CACHE_SIZE = 4096
MAX_TOKEN_CHARS = 8192  # a token of ours is ~400 characters: anything far longer is garbage
REVOKED_PER_CLIENT = 1000  # revoked live tokens kept by jti for one client (see the module docstring)


@dataclass(frozen=True)
class Claims:
    sub: str
    exp: int
    jti: str
    iat: int = 0


@dataclass(frozen=True)
class Revoked:
    """What one revocation refused: the token `jti` of client `sub`, and when it set a cut-off,
    every token of `sub` issued at or before `cut_off` too."""

    sub: str
    jti: str
    cut_off: int | None = None
    exp: int = 0  # the token's expiry: its revocation is kept until then

    def line(self) -> dict[str, Any]:
        """This revocation as a line of the revocation file (broker.security.revocations)."""
        if self.cut_off is not None:
            return {"sub": self.sub, "cut_off": self.cut_off}
        return {"sub": self.sub, "jti": self.jti, "exp": self.exp}


class TokenAuthority:
    """Issues and verifies this gateway's tokens."""

    def __init__(self, key: ec.EllipticCurvePrivateKey, issuer: str, lifetime_s: int) -> None:
        self._key = key
        self.public_key = key.public_key()
        self.issuer = issuer
        self.lifetime_s = lifetime_s
        self._verified: OrderedDict[str, Claims] = OrderedDict()
        self.restore(Kept())
        self._since: set[str] = set()  # client_ids with a token revoked since clients_revoked() last ran

    def restore(self, kept: Kept) -> None:
        """Refuse what `kept` refuses (the revocations on disk, at start), and keep it up to date."""
        self.kept = kept
        self._revoked = kept.revoked  # client_id -> jti -> exp, of revoked live tokens
        self._cut_off = kept.cut_off  # client_id -> tokens issued at or before this are refused

    def jwk(self) -> dict[str, Any]:
        """The public signing key as a JWK (the registration reply's ``signature``)."""
        document: dict[str, Any] = jwt.algorithms.ECAlgorithm.to_jwk(self.public_key, as_dict=True)
        document.update({"use": "sig", "alg": ALGORITHM})
        return document

    def issue(self, sub: str, now: float | None = None) -> tuple[str, int]:
        """A new token for client `sub` and its lifetime in seconds."""
        issued = int(time.time() if now is None else now)
        claims = {
            "iss": self.issuer,
            "sub": sub,
            "iat": issued,
            "exp": issued + self.lifetime_s,
            "jti": secrets.token_urlsafe(16),
        }
        return jwt.encode(claims, self._key, algorithm=ALGORITHM), self.lifetime_s

    def cached(self, token: str) -> Claims | None:
        """The claims of `token` if it verified before, has not expired and is not revoked, else None:
        no signature is checked (the secure gates let such a token through an address's exhausted
        failure budget, broker.security.failures)."""
        claims = self._verified.get(token)
        if claims is None or not _current(claims, time.time()) or self.revoked(claims.sub, claims.jti, claims.iat):
            return None
        return claims

    def revoked(self, sub: str, jti: str, iat: int) -> bool:
        """Whether the token of client `sub` with this `jti`, issued at `iat`, was revoked: by its
        ``jti`` (kept until it expires), or by its client's cut-off."""
        return jti in self._revoked.get(sub, ()) or iat <= self._cut_off.get(sub, -1) or iat <= self.kept.all

    def expired(self, claims: Claims, now: float | None = None) -> bool:
        """Whether verified `claims` are past their expiry (at `now`, the wall clock by default)."""
        return claims.exp <= (time.time() if now is None else now)

    def verify(self, token: str, *, expired_ok: bool = False) -> Claims:
        """The claims of a valid token; Unauthorized for anything else (never says which check failed
        beyond a short reason, and never echoes the token). `expired_ok`: a token past its expiry
        is taken (its signature, issuer and revocation still checked), for ending a subscription."""
        claims = self._verified_claims(token, expired_ok)
        if self.revoked(claims.sub, claims.jti, claims.iat):
            raise Unauthorized("the token was revoked")
        return claims

    def revoke(self, token: str, now: float | None = None) -> Revoked | None:
        """Refuse `token` from now on; what was refused, None if it was not a valid token (nothing to do)."""
        try:
            claims = self.verify(token)
        except Unauthorized:
            return None
        at = time.time() if now is None else now
        revoked = {jti: exp for jti, exp in self._revoked.get(claims.sub, {}).items() if exp > at}
        revoked[claims.jti] = claims.exp
        cut_off = None
        if len(revoked) > REVOKED_PER_CLIENT:
            cut_off = self._cut_off[claims.sub] = self._new_cut_off(claims.sub, int(at), revoked)
            revoked = {}
        self._revoked[claims.sub] = revoked
        self._since.add(claims.sub)
        return Revoked(claims.sub, claims.jti, cut_off, claims.exp)

    def clients_revoked(self) -> set[str]:
        """The client_ids that revoked a token (one that was valid) since the last call, forgotten now."""
        since, self._since = self._since, set()
        return since

    def _new_cut_off(self, sub: str, at: int, revoked: dict[str, int]) -> int:
        """The cut-off replacing `sub`'s list of `revoked` tokens (jti -> exp): every token of it
        issued so far, one issued in this second too. Never earlier than the last cut-off nor than
        the newest revoked token's ``iat`` (its ``exp`` less the lifetime): after the clock stepped
        back (a board without a real-time clock, NTP correcting its boot time by 50 minutes), a
        cut-off set to the new time made the tokens revoked before the step valid again. It fails
        closed: the client's tokens issued before the clock is back past it are refused too."""
        newest = max(exp - self.lifetime_s for exp in revoked.values())
        return max(self._cut_off.get(sub, -1), at, newest)

    def _verified_claims(self, token: str, expired_ok: bool = False) -> Claims:
        now = time.time()
        cached = self._verified.get(token)
        if cached is not None:
            if cached.iat > now:  # see _current
                del self._verified[token]
                raise Unauthorized("the token is not valid yet")
            if cached.exp > now or expired_ok:
                return cached
            del self._verified[token]
            raise Unauthorized("the token has expired")
        if not token or len(token) > MAX_TOKEN_CHARS:
            raise Unauthorized("no valid token")
        try:
            decoded = jwt.decode(
                token,
                self.public_key,
                algorithms=[ALGORITHM],
                issuer=self.issuer,
                options={"require": ["iss", "sub", "iat", "exp", "jti"], "verify_exp": not expired_ok},
            )
        except jwt.ExpiredSignatureError:
            raise Unauthorized("the token has expired") from None
        except jwt.InvalidIssuerError:
            raise Unauthorized("the token was not issued by this gateway") from None
        except (jwt.PyJWTError, UnicodeError):  # UnicodeError: an unpaired surrogate in the text
            raise Unauthorized("the token is not valid") from None
        sub, exp, jti, iat = decoded.get("sub"), decoded.get("exp"), decoded.get("jti"), decoded.get("iat")
        if not isinstance(sub, str) or not isinstance(exp, int) or not isinstance(jti, str) or not isinstance(iat, int):
            raise Unauthorized("the token is not valid")
        claims = Claims(sub, exp, jti, iat)
        if iat > now:  # pyjwt checks it too, on its own reading of the clock
            raise Unauthorized("the token is not valid yet")
        # kept expired too (taken with expired_ok): the cache re-checks the expiry of whatever asks
        # next, and a replayed expired token costs a lookup, not a signature check
        self._verified[token] = claims
        if len(self._verified) > CACHE_SIZE:
            self._verified.popitem(last=False)
        return claims


def _current(claims: Claims, now: float) -> bool:
    """Whether a verified token is within its lifetime at `now`: issued (``iat``) and not expired.

    Why ``iat`` too: pyjwt refuses a token issued after now, but the cache re-checked only the
    expiry. After the wall clock stepped back (NTP correcting a board's clock, which had run ahead),
    a token verified before the step was taken for as long as the step plus its hour (stepped back
    30 days: 30 days), while the same token verified afresh, after a restart, was refused. Refused
    now, its client fetches another, issued and expiring on the corrected clock."""
    return claims.iat <= now < claims.exp
