"""The revocation file (broker/security/revocations.py): each revocation on disk before it is
answered, what a client revoking in a loop costs in writes and file size, and a write that fails.

The restart itself, over real sockets, is in tests/broker/gates/test_token_revocation.py."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from broker.errors import Unauthorized
from broker.security import revocations, tokens
from broker.security.revocations import REVOCATIONS_FILE, RevocationLog, RevocationNotStored
from broker.security.tokens import TokenAuthority

KEY = ec.generate_private_key(ec.SECP256R1())


def started(directory: Path) -> tuple[TokenAuthority, RevocationLog]:
    """A token authority over the revocations of `directory`, as the gateway starts one."""
    authority = TokenAuthority(KEY, "https://gw.test", 3600)
    log = RevocationLog(directory / REVOCATIONS_FILE)
    authority.restore(log.load())
    return authority, log


async def revoke(authority: TokenAuthority, log: RevocationLog, token: str, now: float | None = None) -> None:
    revoked = authority.revoke(token, now)
    assert revoked is not None
    await log.record(revoked.line(), authority.kept)


def test_a_revocation_recorded_is_refused_by_the_next_start_and_expired_ones_are_pruned(tmp_path: Path) -> None:
    authority, log = started(tmp_path)
    stolen, kept = authority.issue("client-a")[0], authority.issue("client-a")[0]
    expiring = authority.issue("client-a", now=time.time() - 3598)[0]  # expires in 2 s

    async def revoke_both() -> None:
        await revoke(authority, log, stolen)
        await revoke(authority, log, expiring)

    asyncio.run(revoke_both())
    again, _ = started(tmp_path)
    with pytest.raises(Unauthorized, match="revoked"):
        again.verify(stolen)
    assert again.verify(kept).sub == "client-a"
    time.sleep(2.1)
    started(tmp_path)
    assert (tmp_path / REVOCATIONS_FILE).read_text().count("\n") == 1  # the expired one is gone


def test_a_client_revoking_in_a_loop_appends_one_line_a_revocation_and_the_file_stays_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """REVOKED_PER_CLIENT and the cut-off bound memory; the file holds at most the live entries of
    its last rewrite plus as many appended (COMPACT_LINES at least), whatever the number of
    revocations. Without the rewrite, 600 revocations made 600 lines."""
    monkeypatch.setattr(tokens, "REVOKED_PER_CLIENT", 50)
    monkeypatch.setattr(revocations, "COMPACT_LINES", 20)
    authority, log = started(tmp_path)
    path = tmp_path / REVOCATIONS_FILE
    longest = 0

    async def loop() -> None:
        nonlocal longest
        base = time.time() - 3000  # a second apart each, so that no cut-off covers the next token
        for second in range(600):
            await revoke(authority, log, authority.issue("client-a", now=base + second)[0], now=base + second)
            longest = max(longest, path.read_text().count("\n"))

    asyncio.run(loop())
    live = tokens.REVOKED_PER_CLIENT + 1  # a full list and the cut-off
    assert longest <= 2 * max(revocations.COMPACT_LINES, live), longest
    assert log.appends >= 600 * 0.8  # most revocations are one append (one fdatasync), not a rewrite


def test_revocations_arriving_together_share_one_sync(tmp_path: Path) -> None:
    """Group commit: 200 revocations sent at once (a flood) are written by one or two writes, not
    200 syncs in a row; each returns only once its line is on disk."""
    authority, log = started(tmp_path)
    issued = [authority.issue("client-a")[0] for _ in range(201)]

    async def flood() -> None:
        await revoke(authority, log, issued[0])  # the file exists: the rest are appends
        await asyncio.gather(*(revoke(authority, log, token) for token in issued[1:]))

    asyncio.run(flood())
    assert log.appends <= 2, log.appends
    assert (tmp_path / REVOCATIONS_FILE).read_text().count("\n") == 201


def test_a_revocation_that_cannot_be_written_is_503_and_the_token_stays_refused(tmp_path: Path) -> None:
    """A fault caused for real: a hard link to the file (which the writer refuses to append
    through, as it refuses a symlink). The client is told (503), not answered 200 for a revocation
    a restart would forget; the token is refused meanwhile all the same."""
    authority, log = started(tmp_path)
    first, second = authority.issue("client-a")[0], authority.issue("client-a")[0]

    async def revoke_with_a_link() -> None:
        await revoke(authority, log, first)
        os.link(tmp_path / REVOCATIONS_FILE, tmp_path / "link")
        with pytest.raises(RevocationNotStored):
            await revoke(authority, log, second)

    asyncio.run(revoke_with_a_link())
    with pytest.raises(Unauthorized, match="revoked"):
        authority.verify(second)


@pytest.mark.parametrize("kind", ["directory", "symlink"])
def test_a_revocation_file_that_cannot_be_opened_stops_the_start_naming_it(tmp_path: Path, kind: str) -> None:
    """Not a damaged file (that one fails closed and starts): one the gateway could not keep a
    revocation in either; a symlink is not followed (the service user controls the directory)."""
    path = tmp_path / REVOCATIONS_FILE
    if kind == "directory":
        path.mkdir()
    else:
        (tmp_path / "elsewhere").write_text("")
        path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match=REVOCATIONS_FILE):
        started(tmp_path)
