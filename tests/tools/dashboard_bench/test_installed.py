"""A gateway "as installed" runs with the installed unit's environment: mimalloc, in its query workers too."""

from __future__ import annotations

from pathlib import Path

from tools.dashboard_bench.installed import installed_gateway, unit_environment


def _children(pid: int) -> list[int]:
    """Every child of `pid`, whichever of its threads started it (/proc's `children` is per thread)."""
    tasks = Path(f"/proc/{pid}/task").iterdir()
    return [int(child) for task in tasks for child in (task / "children").read_text().split()]


def _cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def test_the_gateway_and_its_query_workers_run_on_the_units_malloc(tmp_path: Path) -> None:
    assert unit_environment() == {"LD_PRELOAD": "libmimalloc.so.2"}
    with installed_gateway(tmp_path, coap=False, on_disk=False) as installed:
        pid = installed.gateway.process.pid
        workers = [child for child in _children(pid) if b"broker.workers.replica" in _cmdline(child)]
        assert workers  # the query workers, started with the gateway
        for process in (pid, *workers):
            assert "libmimalloc.so.2" in Path(f"/proc/{process}/maps").read_text()  # preloaded, not merely named
