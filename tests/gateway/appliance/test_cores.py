"""gateway.appliance.cores and broker.workers.cpus against a real `sepa-gateway run`.

What it protects: the served gateway keeps its threads on one core of a multi-core machine (the
GIL's hand-offs stay on one core; the module says what it measured) but its store's compactor;
`[engine] one_core = false`, a store on disk and parallel mode keep every core, and a worker process started after the
pinning, by a pinned thread, still runs on every core instead of inheriting the engine's.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from tools.launcher import RunningGateway

ALLOWED = sorted(os.sched_getaffinity(0))


def cpus(pid: int, tid: int | None = None) -> list[int]:
    """The CPUs a task may run on (its Cpus_allowed_list)."""
    task = Path(f"/proc/{pid}") if tid is None else Path(f"/proc/{pid}/task/{tid}")
    for line in (task / "status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            listed: list[int] = []
            for part in line.split(":", 1)[1].strip().split(","):
                first, _, last = part.partition("-")
                listed += range(int(first), int(last or first) + 1)
            return listed
    raise AssertionError(f"no Cpus_allowed_list for {task}")


def python_threads(pid: int) -> dict[int, str]:
    """The gateway's threads Python started (named sepa-..., and the main one), by task id."""
    named = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        if int(tid) == pid or name.startswith("sepa-"):
            named[int(tid)] = name
    return named


def replicas(pid: int) -> set[int]:
    """The gateway's query worker processes."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                command = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid and b"broker.workers.replica" in command:
                found.add(int(entry))
    return found


def test_the_served_gateway_keeps_its_threads_on_one_core_and_its_workers_on_every_core(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    assert len(ALLOWED) >= 2, "this test needs a machine with two cores or more (the CI machine has two)"
    gateway = start_gateway(toml="[engine]\none_core = true\n")
    pid = gateway.process.pid
    threads = python_threads(pid)
    assert len(threads) > 3
    # all but the store's compactor, whose work holds no GIL: that one may use an idle core (Python
    # 3.11 does not name threads for the system, so it is told apart by its CPUs alone)
    placed = sorted(cpus(pid, tid) for tid in threads)
    assert placed == sorted([ALLOWED] + [[ALLOWED[-1]]] * (len(threads) - 1))
    assert any(f'core="{ALLOWED[-1]}"' in line or f"core={ALLOWED[-1]}" in line for line in gateway.stderr_lines)
    # a worker killed is replaced by a thread of the gateway, pinned: the new one uses every core
    before = replicas(pid)
    assert before and all(cpus(worker) == ALLOWED for worker in before)
    for worker in before:
        os.kill(worker, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # a 500 while its worker is replaced, then a 200 from a new one
        if gateway.query("SELECT * WHERE { ?s ?p ?o } LIMIT 1").status == 200 and replicas(pid) - before:
            break
        time.sleep(0.2)
    after = replicas(pid) - before
    assert after, "no query worker was started again"
    while time.monotonic() < deadline and any(cpus(worker) != ALLOWED for worker in after):
        time.sleep(0.1)  # a worker sets its CPUs once Python runs its module, a moment after it exists
    assert {worker: cpus(worker) for worker in after} == {worker: ALLOWED for worker in after}


def test_one_core_false_a_store_on_rocksdb_or_parallel_mode_keeps_every_core(
    start_gateway: Callable[..., RunningGateway], tmp_path: Path
) -> None:
    for gateway in (
        start_gateway(toml="[engine]\none_core = false\n"),
        start_gateway(toml="[engine]\none_core = true\n[store]\nresident = false\n", data_dir=tmp_path / "data"),
        start_gateway(toml='[engine]\none_core = true\nmode = "parallel"\nworkers = 1\n'),
    ):
        pid = gateway.process.pid
        assert {tid: cpus(pid, tid) for tid in python_threads(pid)} == dict.fromkeys(python_threads(pid), ALLOWED)
