"""Token revocation (RFC 7009): a revoked token is refused until it expires, and what is kept of
revocations is bounded per client."""

from __future__ import annotations

import time

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from broker.errors import Unauthorized
from broker.security import tokens
from broker.security.tokens import TokenAuthority


@pytest.fixture
def authority() -> TokenAuthority:
    return TokenAuthority(ec.generate_private_key(ec.SECP256R1()), "https://gw.test", 3600)


def test_a_revoked_token_is_refused_and_the_clients_other_tokens_are_not(authority: TokenAuthority) -> None:
    first, _ = authority.issue("client-a")
    second, _ = authority.issue("client-a")
    other, _ = authority.issue("client-b")
    assert authority.verify(first).sub == "client-a"  # cached as verified: revocation must see past it
    assert authority.revoke(first)
    with pytest.raises(Unauthorized, match="revoked"):
        authority.verify(first)
    assert authority.verify(second).sub == "client-a"
    assert authority.verify(other).sub == "client-b"


def test_revoking_garbage_or_a_foreign_token_does_nothing(authority: TokenAuthority) -> None:
    foreign = TokenAuthority(ec.generate_private_key(ec.SECP256R1()), "https://gw.test", 3600)
    assert not authority.revoke("not a token")
    assert not authority.revoke(foreign.issue("client-a")[0])
    assert authority._revoked == {}


def test_past_its_bound_a_client_has_every_token_so_far_revoked_and_its_list_emptied(
    authority: TokenAuthority, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client revoking token after token must not grow the gateway's memory: past
    REVOKED_PER_CLIENT live ones, a cut-off replaces its list."""
    monkeypatch.setattr(tokens, "REVOKED_PER_CLIENT", 5)
    issued = [authority.issue("client-a", now=time.time() - 10)[0] for _ in range(7)]
    for token in issued[:6]:
        assert authority.revoke(token, now=time.time() - 5)
    assert len(authority._revoked["client-a"]) == 0  # the sixth took it past 5: a cut-off instead
    for token in issued:  # the seventh, never revoked, was issued before the cut-off too
        with pytest.raises(Unauthorized, match="revoked"):
            authority.verify(token)
    later, _ = authority.issue("client-a")
    assert authority.verify(later).sub == "client-a"


def test_expired_revocations_are_forgotten(authority: TokenAuthority) -> None:
    old, _ = authority.issue("client-a", now=time.time() - 3590)  # expires in 10 s
    assert authority.revoke(old)
    fresh, _ = authority.issue("client-a")
    assert authority.revoke(fresh, now=time.time() + 20)  # the old one has expired by then
    assert list(authority._revoked["client-a"]) == [authority._verified[fresh].jti]


def test_an_expired_token_is_taken_only_when_asked_and_only_if_ours_and_not_revoked(authority: TokenAuthority) -> None:
    """`expired_ok` (a WebSocket unsubscribe) relaxes the expiry and nothing else."""
    old, _ = authority.issue("client-a", now=time.time() - 7200)
    with pytest.raises(Unauthorized, match="expired"):
        authority.verify(old)
    assert authority.verify(old, expired_ok=True).sub == "client-a"
    with pytest.raises(Unauthorized, match="expired"):  # kept by the relaxed check, the expiry checked again
        authority.verify(old)
    foreign = TokenAuthority(ec.generate_private_key(ec.SECP256R1()), "https://gw.test", 3600)
    with pytest.raises(Unauthorized):
        authority.verify(foreign.issue("client-a", now=time.time() - 7200)[0], expired_ok=True)
    fresh, _ = authority.issue("client-b")
    assert authority.revoke(fresh)
    with pytest.raises(Unauthorized, match="revoked"):
        authority.verify(fresh, expired_ok=True)


def test_a_cut_off_never_moves_back_when_the_clock_steps_back(
    authority: TokenAuthority, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token revoked, then the clock stepped back 50 minutes (NTP correcting a board's boot time)
    and the client's revocations passed the bound: the cut-off was set to the new, earlier time and
    the token revoked before the step was valid again."""
    monkeypatch.setattr(tokens, "REVOKED_PER_CLIENT", 5)
    now = time.time()
    stolen, _ = authority.issue("client-a", now=now)
    assert authority.revoke(stolen, now=now)
    for _ in range(tokens.REVOKED_PER_CLIENT):
        assert authority.revoke(authority.issue("client-a", now=now - 3000)[0], now=now - 3000)
    assert authority._revoked["client-a"] == {}  # the list replaced by a cut-off
    with pytest.raises(Unauthorized, match="revoked"):
        authority.verify(stolen)
    # the price: its tokens issued before the clock is back past the cut-off are refused too
    with pytest.raises(Unauthorized, match="revoked"):
        authority.verify(authority.issue("client-a", now=now - 2990)[0])


def test_a_token_issued_after_now_is_refused_from_the_cache_too(
    authority: TokenAuthority, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wall clock stepped back 30 days (NTP correcting a board's clock that ran ahead): a token
    verified before the step stayed good from the cache for 30 days and an hour, while pyjwt refuses
    the same token verified afresh (issued after now). Both ways refuse it now; its client fetches
    a new one."""
    now = time.time()
    token, _ = authority.issue("client-a", now=now)
    assert authority.verify(token).sub == "client-a"  # verified, cached
    monkeypatch.setattr(tokens.time, "time", lambda: now - 30 * 86_400)
    assert authority.cached(token) is None
    with pytest.raises(Unauthorized, match="not valid yet"):
        authority.verify(token)
    with pytest.raises(Unauthorized):  # and again, no longer from the cache
        authority.verify(token)


def test_an_expired_token_of_ours_is_checked_once_then_a_replay_is_a_lookup(authority: TokenAuthority) -> None:
    """The secure gates refuse such a token without charging the address's failure budget
    (broker.security.authority), so its signature check must not be repeatable at will: the cache
    keeps it. Seen here by swapping the public key: a second check never looks at the signature."""
    old, _ = authority.issue("client-a", now=time.time() - 7200)
    assert authority.verify(old, expired_ok=True).sub == "client-a"
    authority.public_key = ec.generate_private_key(ec.SECP256R1()).public_key()
    claims = authority.verify(old, expired_ok=True)
    assert claims.sub == "client-a" and authority.expired(claims)
