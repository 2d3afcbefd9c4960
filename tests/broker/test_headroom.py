"""The store refuses to grow while the machine is short of memory (broker.headroom): a clear 507,
counted, nothing half-applied, the gateway alive, and what frees memory (deletions, a value
replaced) still runs. A floor above the machine's whole memory is a real low-memory state for the
gateway: MemAvailable is read from /proc as it would be on a full board. A control group of the
kernel with a memory limit (made by the test, as root: systemd's MemoryMax=, a container's --memory)
is a real limited gateway."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.api import Headroom, StoreFull
from broker.headroom import MIN_FLOOR_BYTES, SAMPLE_S, cgroup_limit, default_floor, meminfo
from tools.launcher import RunningGateway

EX = "PREFIX ex: <http://example.org/> "
# more than the machine has: every sample is under it
ABOVE_ALL_MB = (meminfo()["MemTotal"] >> 20) * 2


def test_meminfo_and_the_default_floor() -> None:
    figures = meminfo()
    assert 0 < figures["MemAvailable"] <= figures["MemTotal"]
    assert default_floor() == max(MIN_FLOOR_BYTES, figures["MemTotal"] // 8)


def test_growth_is_refused_under_the_floor_and_counted() -> None:
    low = Headroom(ABOVE_ALL_MB << 20)
    low.check(0)  # nothing added: runs
    low.check(-5)  # frees memory: runs
    with pytest.raises(StoreFull) as refused:
        low.check(1)
    assert refused.value.status_code == 507 and refused.value.error == "store_full"
    assert "MiB available" in refused.value.description
    assert low.refused == 1 and low.metrics()["refused_growth_total"] == 1
    Headroom(0).check(10**9)  # a floor of nothing never refuses


def _config(tmp_path: Path, floor_mb: int, name: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f"[store]\nmemory_floor_mb = {floor_mb}\n[mqtt]\nenabled = false\n")
    return path


def test_a_gateway_short_of_memory_refuses_growth_and_runs_what_frees_it(
    start_gateway: Callable[..., RunningGateway], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    roomy = start_gateway(config=_config(tmp_path, 0, "roomy"), data_dir=data)
    roomy.post_update(EX + "INSERT DATA { ex:valve ex:state 'open' . ex:a ex:p 1 . ex:b ex:p 2 }")
    roomy.stop()
    gateway = start_gateway(config=_config(tmp_path, ABOVE_ALL_MB, "short"), data_dir=data)

    reply = gateway.update(EX + "INSERT DATA { ex:c ex:p 3 }")
    assert reply.status == 507, reply.body
    assert reply.json()["error"] == "store_full"
    # a request of several operations whose first grows the store: refused before it is applied
    reply = gateway.update(EX + "INSERT DATA { ex:d ex:p 4 } ; DELETE DATA { ex:a ex:p 1 }")
    assert reply.status == 507, reply.body
    assert gateway.ask(EX + "ASK { ex:a ex:p 1 }") and not gateway.ask(EX + "ASK { ?s ex:p 3 } ")
    assert not gateway.ask(EX + "ASK { ex:d ?p ?o }")

    # a value replaced (as many quads removed as added) and a deletion run
    replaced = gateway.update(
        EX + "DELETE { ex:valve ex:state ?s } INSERT { ex:valve ex:state 'shut' } WHERE { ex:valve ex:state ?s }"
    )
    assert replaced.status == 200, replaced.body
    assert gateway.select(EX + "SELECT ?s WHERE { ex:valve ex:state ?s }") == [{"s": "shut"}]
    assert gateway.update(EX + "DELETE WHERE { ex:b ?p ?o }").status == 200
    assert not gateway.ask(EX + "ASK { ex:b ?p ?o }")

    metrics = gateway.metrics()
    assert metrics["sepa_store_refused_growth_total"] == 2
    assert metrics["sepa_store_memory_floor_bytes"] == ABOVE_ALL_MB << 20
    assert 0 < metrics["sepa_store_memory_available_bytes"] < ABOVE_ALL_MB << 20
    health = gateway.request("GET", "/health")
    assert health.status == 503
    store = health.json()["components"]["store"]
    assert store["status"] == "failing" and "507" in store["detail"]
    assert gateway.running


class MemoryGroup:
    """A memory control group made for one test, under the kernel's v2 hierarchy or v1's memory
    controller, whichever this machine mounts at /sys/fs/cgroup."""

    def __init__(self) -> None:
        root = Path("/sys/fs/cgroup")
        controllers = root / "cgroup.controllers"
        self.v1 = not (controllers.exists() and "memory" in controllers.read_text().split())
        parent = root / "memory" if self.v1 else root
        assert (parent / "cgroup.procs").exists(), "no memory controller at /sys/fs/cgroup (the test runs as root)"
        self.parent = parent
        self.path = parent / f"sepa-test-{uuid.uuid4().hex[:8]}"
        self.path.mkdir()

    def limit(self, size: int) -> None:
        (self.path / ("memory.limit_in_bytes" if self.v1 else "memory.max")).write_text(str(size))

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        """Its processes back to the parent group, and the group gone (once)."""
        if not self.path.exists():
            return
        for pid in (self.path / "cgroup.procs").read_text().split():
            (self.parent / "cgroup.procs").write_text(pid)
        self.path.rmdir()


@pytest.fixture
def memory_group() -> Iterator[MemoryGroup]:
    group = MemoryGroup()
    yield group
    group.remove()


def test_a_gateway_in_a_memory_limited_control_group_counts_its_limit(
    start_gateway: Callable[..., RunningGateway], tmp_path: Path, memory_group: MemoryGroup
) -> None:
    """The machine has far more than the floor available, its control group far less: the group's
    limit is what the OOM killer enforces, so growth is refused; out of the group, it runs again."""
    floor_mb, limit_mb = 600, 512
    assert meminfo()["MemAvailable"] > 2 * (floor_mb << 20), "the test needs the machine roomy"
    gateway = start_gateway(config=_config(tmp_path, floor_mb, "limited"), data_dir=tmp_path / "data")
    assert gateway.update(EX + "INSERT DATA { ex:a ex:p 1 }").status == 200
    assert gateway.metrics()["sepa_store_memory_limit_bytes"] == 0

    memory_group.limit(limit_mb << 20)
    memory_group.add(gateway.process.pid)
    time.sleep(SAMPLE_S)  # the next sample reads the group
    reply = gateway.update(EX + "INSERT DATA { ex:b ex:p 2 }")
    assert reply.status == 507, reply.body
    assert reply.json()["error"] == "store_full"
    metrics = gateway.metrics()
    assert metrics["sepa_store_memory_limit_bytes"] == limit_mb << 20
    assert 0 < metrics["sepa_store_memory_available_bytes"] <= limit_mb << 20
    assert gateway.request("GET", "/health").status == 503

    memory_group.remove()  # back in the machine's own group: room again
    time.sleep(SAMPLE_S)
    assert gateway.update(EX + "INSERT DATA { ex:b ex:p 2 }").status == 200
    assert gateway.metrics()["sepa_store_memory_limit_bytes"] == 0
    assert gateway.running


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_tightest_limit_of_a_v2_group_and_the_groups_above_it(tmp_path: Path) -> None:
    """This machine's kernel may mount v1 (the test above uses what it has): the v2 layout, as
    systemd writes it for a unit with MemoryMax= in a slice with MemoryHigh=, read from a copy."""
    proc = tmp_path / "cgroup"
    proc.write_text("0::/system.slice/sepa-gateway.service\n")
    root = tmp_path / "fs"
    unit = "system.slice/sepa-gateway.service"
    _write(
        root,
        {
            "cgroup.controllers": "cpu io memory pids\n",
            f"{unit}/memory.max": f"{1 << 30}\n",
            f"{unit}/memory.high": "max\n",
            f"{unit}/memory.current": f"{600 << 20}\n",
            f"{unit}/memory.stat": f"anon {400 << 20}\nfile {200 << 20}\ninactive_file {150 << 20}\n",
            "system.slice/memory.max": "max\n",
            "system.slice/memory.high": f"{800 << 20}\n",
            "system.slice/memory.current": f"{700 << 20}\n",
            "system.slice/memory.stat": "inactive_file 0\n",
        },
    )
    # the unit: 1 GiB less (600 - 150) MiB used = 574 MiB; the slice: 800 less 700 = 100 MiB
    assert cgroup_limit(str(proc), str(root)) == (800 << 20, 100 << 20)
    (root / "system.slice/memory.high").write_text("max\n")
    assert cgroup_limit(str(proc), str(root)) == (1 << 30, 574 << 20)
    # over its limit (the kernel reclaims and throttles): no room, not a negative one
    (root / f"{unit}/memory.current").write_text(f"{2 << 30}\n")
    assert cgroup_limit(str(proc), str(root)) == (1 << 30, 0)
    headroom = Headroom(64 << 20, proc_cgroup=str(proc), cgroup_root=str(root))
    assert headroom.low and headroom.metrics()["memory_limit_bytes"] == 1 << 30
    with pytest.raises(StoreFull):
        headroom.check(1)
    # no limit anywhere ("max"; v1's largest number), or no memory controller: the machine's figure
    (root / f"{unit}/memory.max").write_text("max\n")
    assert cgroup_limit(str(proc), str(root)) is None
    os.remove(root / "cgroup.controllers")
    assert cgroup_limit(str(proc), str(root)) is None
    assert not Headroom(64 << 20, proc_cgroup=str(proc), cgroup_root=str(root)).low
