"""The secure gates' TLS context (gateway/appliance/security.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from broker.api import tls_files
from gateway.appliance.security import server_context


def test_a_certificate_and_a_key_that_are_not_a_pair_are_refused_naming_both(tmp_path: Path) -> None:
    """Each loads alone, so only the pair can be wrong: ssl said '[SSL: KEY_VALUES_MISMATCH]' and
    named neither file."""
    first, second = tls_files(tmp_path / "a", names=["a"]), tls_files(tmp_path / "b", names=["b"])
    with pytest.raises(ValueError, match=rf"^{first.cert} and {second.key} are not a pair \(KEY_VALUES_MISMATCH"):
        server_context(replace(first, key=second.key))
