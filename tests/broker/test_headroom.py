"""The store refuses to grow while the machine is short of memory (broker.headroom): a clear 507,
counted, nothing half-applied, the gateway alive, and what frees memory (deletions, a value
replaced) still runs. A floor above the machine's whole memory is a real low-memory state for the
gateway: MemAvailable is read from /proc as it would be on a full board."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from broker.api import Headroom, StoreFull
from broker.headroom import MIN_FLOOR_BYTES, default_floor, meminfo
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
