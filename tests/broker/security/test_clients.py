"""The client registry (broker/security/clients.py) and the registration rules of the authority
over it: what a refused registration tells."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from broker.security.authority import REGISTRATION_REFUSED, Authority, UnauthorizedClient

NOW = "2026-12-05T00:00:00+00:00"


def _registration(identity: str) -> dict[str, object]:
    return {"register": {"client_identity": identity, "grant_types": ["client_credentials"]}}


def test_a_refusal_tells_the_network_nothing_of_which_identities_exist(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The replies "already registered (the operator can reset it)" and "not allowed to register"
    told an unauthenticated host which identities exist. One text for every refusal; the log has why."""
    authority = Authority(
        tmp_path, issuer="test", lifetime_s=60, configured=[{"identity": "app"}, {"identity": "gone"}]
    )
    authority.register(_registration("app"))
    authority.registry.revoke("gone")
    caplog.set_level(logging.WARNING, logger="broker.security.authority")
    authority.registrations_refused.every_s = 0  # every refusal logged here, not one a minute
    replies = []
    for identity in ("app", "stranger", "gone"):
        with pytest.raises(UnauthorizedClient) as refused:
            authority.register(_registration(identity))
        replies.append(refused.value.description)
    assert replies == [REGISTRATION_REFUSED] * 3
    reasons = [record.reason for record in caplog.records if record.getMessage() == "registration refused"]
    assert [reason.split(" (")[0] for reason in reasons] == [
        "this client identity is already registered",
        "this client identity is not allowed to register",
        "this client identity is not allowed to register",
    ]
