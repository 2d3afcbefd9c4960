"""A full disk under a running gateway (broker.store.RdfStore.apply, Gateway._store_failed): the
update that meets it gets 503 `store_failed`, the gateway exits with status 1 for systemd to start
it again, and the new process has every update that got a 200 and takes updates again.

Before: the update got 500 `internal_error` (a traceback logged per request), and every update
after it too, for good, even once space was back (RocksDB stays in its error state until reopened);
stopping exited 1 on a flush that raised. The full disk is RLIMIT_FSIZE (a write past it fails with
EFBIG), which needs no root, unlike a small tmpfs (where the same was measured, ENOSPC).
"""

from __future__ import annotations

from pathlib import Path

from tools.launcher import launch_gateway

FILL = "x" * 200


def block(k: int) -> str:
    return "INSERT DATA { " + " ".join(f'<urn:s{k}_{i}> <urn:p> "{FILL}{i}" .' for i in range(2000)) + " }"


def test_a_full_disk_stops_the_gateway_with_503_and_a_restart_has_every_acknowledged_update(tmp_path: Path) -> None:
    data = tmp_path / "data"
    gateway = launch_gateway(data_dir=data, file_size_limit=6 << 20)
    acknowledged = 0
    try:
        for k in range(100):
            reply = gateway.update(block(k))
            if reply.status != 200:
                break
            acknowledged += 1
        assert 0 < acknowledged < 100, "the disk never filled"
        assert reply.status == 503 and reply.json()["error"] == "store_failed", reply.body
        assert gateway.process.wait(30) == 1  # for systemd's Restart=on-failure
        assert any("the store cannot write" in line for line in gateway.stderr_lines)
        assert not any("Traceback" in line for line in gateway.stderr_lines)
    finally:
        if gateway.process.poll() is None:
            gateway.process.kill()
    restarted = launch_gateway(data_dir=data)
    try:
        stored = int(restarted.select("SELECT (COUNT(*) AS ?n) WHERE { ?s <urn:p> ?o }")[0]["n"])
        assert acknowledged * 2000 <= stored <= (acknowledged + 1) * 2000  # the refused one's fate: either
        assert stored % 2000 == 0  # whole or not at all
        assert restarted.update("INSERT DATA { <urn:a> <urn:b> 1 }").status == 200
    finally:
        assert restarted.stop() == 0
