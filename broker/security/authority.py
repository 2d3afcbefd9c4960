"""OAuth 2.0 client credentials over the registry and the tokens: register, token, authenticate.

Sans-I/O: the secure gates hand in header values and JSON bodies and get back replies or errors;
nothing here knows aiohttp, so every rule is tested without sockets and reused by any transport.
"""

from __future__ import annotations

import base64
import hmac
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from broker.core.access import GraphAccess
from broker.errors import Forbidden, InvalidRequest, SepaError, Unauthorized
from broker.quiet_log import QuietLog
from broker.security.clients import Client, ClientRegistry, RegistryError, secret_digest
from broker.security.failures import BURST, PER_S, FailureBudget, TooManyFailures
from broker.security.keys import signing_key
from broker.security.revocations import REVOCATIONS_FILE, RevocationLog
from broker.security.tokens import Revoked, TokenAuthority

log = logging.getLogger(__name__)
# a line per revoked token let a client with credentials write the log at its own pace (a token
# request and a revocation a line); one line a minute at most, with the count since (`refused`)
REVOKED = QuietLog(log, "token revoked")


class UnauthorizedClient(SepaError):
    """Registration refused, or client credentials wrong (OAuth's ``unauthorized_client``)."""

    error = "unauthorized_client"
    status_code = 401


class UnsupportedGrantType(SepaError):
    """A token request naming a grant other than client credentials (RFC 6749 5.2)."""

    error = "unsupported_grant_type"
    status_code = 400


@dataclass(frozen=True)
class Principal:
    """Who sent a secure request, and what it may do; `jti` and `iat`: the token it was sent with.

    Why the token's ids: a WSS subscription keeps its principal, and one made with a token revoked
    since (RFC 7009, by its ``jti`` or a cut-off on ``iat``) is ended by the revocation watch
    (:meth:`Authority.still_valid`); before, a thief's subscriptions outlived the owner's revocation
    of the stolen token until the client was reset. Two fields a subscription, no table per token."""

    identity: str
    client_id: str
    access: GraphAccess
    jti: str = ""
    iat: int = 0


# the one reply to every refused registration, whatever the reason (the log has it)
REGISTRATION_REFUSED = "this client identity may not register"
# compared against when the client_id is unknown, so that the time taken does not tell
_NO_SECRET = secret_digest("no client has this secret")
# why an authentication failed, as /metrics counts it (sepa_security_auth_failures_total{reason}):
# an unknown client or a wrong secret (or none) at /oauth/token, a refused registration, a missing,
# forged, expired or revoked bearer token, and an attempt refused by the address's failure budget
FAILURE_REASONS = ("wrong_secret", "registration_refused", "bad_token", "rate_limited")


class Authority:
    """Registration, token issuance and request authentication of one gateway."""

    def __init__(
        self,
        directory: Path,
        *,
        issuer: str,
        lifetime_s: int,
        configured: list[dict[str, Any]],
        failure_burst: int = BURST,
        failures_per_s: float = PER_S,
    ) -> None:
        self.registry = ClientRegistry(directory, configured)
        self.tokens = TokenAuthority(signing_key(directory), issuer, lifetime_s)
        # the revocations of tokens survive a restart (broker.security.revocations): read at start
        self.revocations = RevocationLog(directory / REVOCATIONS_FILE)
        self.tokens.restore(self.revocations.load())
        # failed authentications per network address (broker.security.failures), and why each failed
        self.budget = FailureBudget(failure_burst, failures_per_s)
        self.failures: Counter[str] = Counter({reason: 0 for reason in FAILURE_REASONS})
        # any host that reaches the HTTPS port can be refused at will: counted (its `total` is
        # sepa_security_registrations_refused_total), logged once a minute at most (broker.quiet_log)
        self.registrations_refused = QuietLog(log, "registration refused", level=logging.WARNING)

    @contextmanager
    def attempt(self, peer: str | None, reason: str) -> Iterator[None]:
        """One authentication attempt from `peer` (None: this board): refused with 429 before its
        work when the address has no failure left (broker.security.failures); a 401 out of it is
        counted under `reason` and keeps its token, anything else (success, a malformed request)
        gives it back. On the event loop only."""
        try:
            self.budget.take(peer)
        except TooManyFailures:
            self.failures["rate_limited"] += 1
            raise
        try:
            yield
        except (UnauthorizedClient, Unauthorized):
            self.failures[reason] += 1
            raise
        except BaseException:
            self.budget.give_back(peer)
            raise
        self.budget.give_back(peer)

    # -- /oauth/register ------------------------------------------------------------------------

    def register(self, body: Any) -> dict[str, Any]:
        """The 201 reply to a registration request (PROTOCOL.md), or an error."""
        request = body.get("register") if isinstance(body, dict) else None
        if not isinstance(request, dict):
            raise InvalidRequest(
                'expected {"register": {"client_identity": "...", "grant_types": ["client_credentials"]}}'
            )
        identity = request.get("client_identity")
        grants = request.get("grant_types", ["client_credentials"])
        if not isinstance(identity, str) or not identity:
            raise InvalidRequest("'client_identity' (a string) is required")
        if not isinstance(grants, list) or "client_credentials" not in grants:
            raise InvalidRequest("only the client_credentials grant is supported")
        try:
            client, secret = self.registry.register(identity, datetime.now(UTC).isoformat(timespec="seconds"))
        except RegistryError as error:
            # the reason is logged only: told apart on the wire, "already registered" and "not
            # allowed" said which identities exist to anyone who reaches the port
            self.registrations_refused(identity=identity[:128], reason=str(error))
            raise UnauthorizedClient(REGISTRATION_REFUSED) from None
        log.info("client registered", extra={"identity": identity, "client_id": client.client_id})
        return {"credentials": {"client_id": client.client_id, "client_secret": secret, "signature": self.tokens.jwk()}}

    # -- /oauth/token ---------------------------------------------------------------------------

    def token(
        self, authorization: str | None, grant_type: str | None = None, peer: str | None = None
    ) -> dict[str, Any]:
        """The 201 reply to a token request with ``Authorization: Basic``, in both forms clients use.

        `grant_type` is what the request's body named, if anything: SEPA clients send none (sepa-js
        an empty body, sepy no body), so only a grant named and other than client credentials is
        refused; a password or code grant was answered with a client-credentials token. `peer`: the
        request's network address (None: this board), whose failure budget is charged."""
        if grant_type is not None and grant_type != "client_credentials":
            raise UnsupportedGrantType("only the client_credentials grant is supported")
        with self.attempt(peer, "wrong_secret"):
            client_id, secret = _basic(authorization)
            client = self.registry.by_client_id(client_id)
            stored = client.secret_sha256 if client is not None else None
            matches = hmac.compare_digest(secret_digest(secret), stored or _NO_SECRET)
            # `stored` required: _NO_SECRET's text is in the source, so it must never be a secret itself
            if client is None or not stored or not matches or client.revoked:
                raise UnauthorizedClient("wrong client credentials")
            token, expires_in = self.tokens.issue(client_id)
        reply = {"access_token": token, "token_type": "bearer", "expires_in": expires_in}
        return {"token": dict(reply), **reply}

    # -- secure requests ------------------------------------------------------------------------

    def authenticate(self, authorization: Any, peer: str | None = None, *, expired_ok: bool = False) -> Principal:
        """The principal of a request's ``Authorization`` value (``Bearer <JWT>`` or a bare JWT).

        Every failure is 401 invalid_grant and names no detail an attacker could use. `peer`: the
        request's network address (None: this board). A token verified before (cached, unexpired, not revoked)
        of a client still registered passes whatever the address's failure budget: that check is
        a lookup; any other attempt is charged to the budget (broker.security.failures).
        `expired_ok`: a token of ours past its expiry is taken too (a WebSocket unsubscribe: sepy
        never renews the token of its socket, and could not end its subscriptions once it expired;
        ending a subscription only takes access away)."""
        token = None
        if isinstance(authorization, str) and authorization.strip():
            scheme, _, rest = authorization.strip().partition(" ")
            token = rest.strip() if scheme.lower() == "bearer" else authorization.strip()
            known = self.tokens.cached(token)
            if known is not None:
                client = self.registry.by_client_id(known.sub)
                if client is not None and not client.revoked:
                    return Principal(client.identity, known.sub, client.access, known.jti, known.iat)
        with self.attempt(peer, "bad_token"):
            if token is None:
                raise Unauthorized("a bearer token is required (Authorization: Bearer <JWT>)")
            claims = self.tokens.verify(token, expired_ok=True)  # the expiry is checked below
            client = self.registry.by_client_id(claims.sub)
            if client is None or client.revoked:
                raise Unauthorized("the client of this token is no longer registered")
        # Ours, not revoked, of a client still registered, only past its expiry: refused, but not
        # charged to the address's failure budget (broker.security.failures), since nobody guesses
        # a token the gateway signed, and the signature is checked once (the tokens' cache keeps it)
        if not expired_ok and self.tokens.expired(claims):
            self.failures["bad_token"] += 1
            raise Unauthorized("the token has expired")
        return Principal(client.identity, claims.sub, client.access, claims.jti, claims.iat)

    def revoke(self, token: str, peer: str | None = None) -> Revoked | None:
        """Refuse `token` from now on (RFC 7009; see broker.security.tokens); what was refused, None
        when it was not a valid token (nothing changes). One not verified before costs a signature
        check: charged to `peer`'s failure budget like any bearer token, counted as `bad_token` when
        it is not valid (the reply is 200 all the same, as RFC 7009 asks), TooManyFailures (429) when
        the address has none left."""
        if self.tokens.cached(token) is None:
            try:
                with self.attempt(peer, "bad_token"):
                    revoked = self.tokens.revoke(token)
                    if revoked is None:
                        raise Unauthorized("not a valid token")
            except Unauthorized:
                return None
        else:
            revoked = self.tokens.revoke(token)
            if revoked is None:
                return None
        REVOKED()
        return revoked

    async def store(self, revoked: Revoked) -> None:
        """Return once `revoked` is on disk (its 200 waits for it): the next start refuses the token
        too. RevocationNotStored (503) when it could not be written; the token stays refused until then."""
        await self.revocations.record(revoked.line(), self.tokens.kept)

    def still_valid(self, principal: Principal, registrations: dict[str, Client] | None = None) -> bool:
        """Whether `principal` is still registered with the same rights, and the token it came with
        not revoked (revocation watch), in `registrations` (a :meth:`ClientRegistry.registrations`
        snapshot) or the registry now. Its token's expiry is not checked: a subscription outlives
        it (docs/security.md, "Revocation")."""
        if registrations is None:
            registrations = self.registry.registrations()
        client = registrations.get(principal.client_id)
        if client is None or client.revoked or client.access != principal.access:
            return False
        return not (principal.jti and self.tokens.revoked(principal.client_id, principal.jti, principal.iat))

    def validity(self) -> Callable[[Principal], bool]:
        """`still_valid` over the registry as it is now, looked at once: the watch checks every
        secure subscription with it, on the event loop (10,000 checks took 42.8 ms with a stat of
        the registry file each, 10.6 ms so, on a desktop x86 core; more on a Raspberry Pi)."""
        registrations = self.registry.registrations()
        return lambda principal: self.still_valid(principal, registrations)

    def tokens_revoked(self) -> Callable[[Principal], bool] | None:
        """Whether a principal's token still stands, for the clients that revoked a token since the
        last call (None: none did); the registry is not looked at. Why: any client with credentials
        can revoke a token a second, and :meth:`validity` over 10,000 subscriptions takes 44-46 ms
        of CPU (32-34 ms before the token was checked too); this takes 5.7-6.0 ms when all 10,000 are
        the revoking client's, 1.4-1.9 ms when none is (medians of 20, 2-core machine at load 7-9,
        2026-12-07, `PYTHONPATH=. python /tmp/atk-rvk/scan.py`)."""
        clients = self.tokens.clients_revoked()
        if not clients:
            return None
        revoked = self.tokens.revoked
        return lambda p: p.client_id not in clients or not p.jti or not revoked(p.client_id, p.jti, p.iat)

    def standing(self) -> Callable[[str, str | None], bool]:
        """Whether a delayed update (owner, registration) may still run, as :meth:`access_of` decides
        when it falls due, over the registry as it is now, looked at once."""
        clients = self.registry.current()

        def stands(identity: str, registration: str | None) -> bool:
            client = clients.get(identity)
            if client is None or client.revoked:
                return False
            return registration is None or client.client_id == registration

        return stands

    def access_of(self, identity: str, registration: str | None = None) -> GraphAccess:
        """The current rights of `identity` (a delayed update runs with its owner's rights when due),
        if its `registration` (the client_id that scheduled the update) still stands. Why: a reset
        is how an operator rotates a stolen secret, and whoever held it could have scheduled up to
        max_pending_per_client updates, due whenever they liked, that ran after the reset."""
        client = self.registry.get(identity)
        if client is None or client.revoked:
            raise Forbidden(f"the client {identity!r} that scheduled this update is revoked")
        if registration is not None and client.client_id != registration:
            raise Forbidden(f"the registration of {identity!r} that scheduled this update was reset since")
        return client.access


def _basic(authorization: str | None) -> tuple[str, str]:
    if not authorization:
        raise UnauthorizedClient("send the client credentials with Authorization: Basic")
    scheme, _, encoded = authorization.strip().partition(" ")
    if scheme.lower() != "basic":
        raise UnauthorizedClient("send the client credentials with Authorization: Basic")
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except ValueError:  # binascii.Error, UnicodeDecodeError, and non-ASCII text (was a 500 and a traceback)
        raise UnauthorizedClient("malformed Basic credentials") from None
    client_id, colon, secret = decoded.partition(":")
    if not colon:
        raise UnauthorizedClient("malformed Basic credentials")
    return client_id, secret
