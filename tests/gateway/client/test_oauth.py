"""gateway.client.oauth's credentials file, as a user of the client meets it on disk.

Protects: the saved client secret is this user's file, mode 0600, whatever PATH.tmp held before
(left by an interrupted save, or planted by another user in a shared directory: a file of theirs,
0666, or a symlink), and nothing is left beside it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gateway.client.oauth import Credentials


def test_a_planted_temporary_file_does_not_get_the_secret(tmp_path: Path) -> None:
    """Before: O_CREAT|O_TRUNC on PATH.tmp reused the planted file, and the secret ended up 0666,
    owned by the user who planted it."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    target = shared / "gw.json"
    planted = shared / "gw.json.tmp"
    planted.write_text("")
    planted.chmod(0o666)
    if os.geteuid() == 0:
        os.chown(planted, 12345, 12345)  # another user's
    Credentials("client-id", "THE-CLIENT-SECRET").save(target)
    status = target.stat()
    assert stat.S_IMODE(status.st_mode) == 0o600 and status.st_uid == os.geteuid()
    assert Credentials.load(target) == Credentials("client-id", "THE-CLIENT-SECRET")
    assert planted.read_text() == ""  # untouched
    assert sorted(path.name for path in shared.iterdir()) == ["gw.json", "gw.json.tmp"]


def test_a_planted_symlink_is_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("kept")
    target = tmp_path / "gw.json"
    (tmp_path / "gw.json.tmp").symlink_to(elsewhere)
    Credentials("client-id", "THE-CLIENT-SECRET").save(target)
    assert elsewhere.read_text() == "kept" and not target.is_symlink()
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
