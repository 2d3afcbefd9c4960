"""`sepa-gateway bench parallel`: its options, its pure parts, and one small real run of both modes.

Why a real run: the benchmark's worth is that the sequential and the parallel engine are measured
on the same workload and deliver the same notifications, which only real engines (BOOSTER worker
processes included) can show. The run is cut small (2 fig7 rounds, 12 ROAD and LAMP updates, one
repeat, no wire phase) but keeps the full knowledge base and profile S, and goes through the
command's handler, as a user's invocation does.
"""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

import pytest

from broker.api import Notification
from gateway.appliance.cli import build_parser, main
from tools.lighting.profiles import u_road
from tools.parallel import runner

SMALL = ["--skip-wire", "--rounds", "2", "--repeats", "1", "--updates", "12", "--workers", "1"]


@pytest.fixture(scope="module")
def small_run() -> tuple[int, dict[str, Any]]:
    """(exit code, JSON report) of one small `bench parallel --json --quiet` invocation."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["bench", "parallel", "--json", "--quiet", *SMALL])
    return code, json.loads(out.getvalue())


def test_cli_registers_bench_parallel_with_its_defaults() -> None:
    args = build_parser().parse_args(["bench", "parallel"])
    assert args.handler.__name__ == "run_parallel"
    assert (args.rounds, args.repeats, args.wire_updates, args.updates) == (20, 3, 3000, None)
    assert args.workers == runner.default_workers() >= 1
    assert not (args.json or args.skip_wire or args.strict or args.quiet)
    args = build_parser().parse_args(["bench", "parallel", "--json", *SMALL, "--strict"])
    assert (args.rounds, args.repeats, args.updates, args.workers) == (2, 1, 12, 1)
    assert args.json and args.skip_wire and args.strict
    for bad in (["--workers", "0"], ["--rounds", "0"], ["--updates", "311"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["bench", "parallel", *bad])


def test_fig7_rounds_set_a_new_dimming_value_each() -> None:
    texts = [runner.fig7_update(305, r) for r in range(3)]
    assert [('"100"' in t, '"101"' in t, '"102"' in t) for t in texts] == [
        (True, False, False),
        (False, True, False),
        (False, False, True),
    ]
    assert texts[1].replace('"101"', '"100"') == u_road(305)


def test_notifications_are_compared_by_alias_not_spuid() -> None:
    log = runner.NotificationLog()
    row_a, row_b = ("a", "1"), ("b", "2")
    log(Notification("spu-1", "S", 1, ("x", "y"), added=(row_b, row_a)))
    other = runner.NotificationLog()
    other(Notification("spu-2", "S", 1, ("x", "y"), added=(row_a, row_b)))
    other(Notification("spu-2", "S", 0, ("x", "y"), added=(row_a,)))  # the reply to subscribe: not counted
    assert log.keys == other.keys and other.count == 1
    other(Notification("spu-2", "S", 2, ("x", "y"), removed=(row_a,)))
    assert log.keys != other.keys


def test_cpu_busy_is_per_core_busy_over_elapsed_ticks() -> None:
    before = {"cpu0": (100, 1000), "cpu1": (500, 1000)}
    after = {"cpu0": (150, 1100), "cpu1": (500, 1000)}
    assert runner.cpu_busy(before, after) == {"cpu0": 0.5, "cpu1": None}
    now = runner.cpu_times()
    assert now and all(0 <= busy <= total for busy, total in now.values())
    assert runner.vm_hwm_mb() > 10 and runner.vm_hwm_mb(2**22 + 1) is None


def test_exit_code_reports_errors_and_with_strict_differing_notifications() -> None:
    fine = {"fig7": {"notifications_ok": True}, "ROAD": {}, "LAMP": {}, "wire": {"skipped": True}}
    assert runner.exit_code(fine) == runner.exit_code(fine, strict=True) == 0
    differ = {**fine, "LAMP": {"notifications_ok": False}}
    assert runner.exit_code(differ) == 0 and runner.exit_code(differ, strict=True) == 1
    failed = {**fine, "ROAD": {"error": "RuntimeError: boom"}}
    assert runner.exit_code(failed) == 1 and runner.errors(failed) == ["ROAD"]


def test_small_run_reports_every_documented_key(small_run: tuple[int, dict[str, Any]]) -> None:
    code, report = small_run
    assert code == 0
    assert set(report) == {"workers", "cores", "fig7", "ROAD", "LAMP", "wire", "bars"}
    assert report["workers"] == 1 and report["cores"] >= 1 and report["wire"] == {"skipped": True}
    assert set(report["bars"]) == {"fig7_speedup", "road_speedup", "lamp_speedup", "wire_parallel_ratio"}
    assert [report["bars"][k]["bar"] for k in report["bars"]] == [1.5, 1.4, 0.9, 0.8]
    assert report["bars"]["wire_parallel_ratio"]["met"] is None
    fig7 = report["fig7"]
    assert report["bars"]["fig7_speedup"]["value"] == fig7["speedup"] > 0
    for phase in (fig7, report["ROAD"], report["LAMP"]):  # one alternated pair: its speedup is the phase's
        (pair,) = phase["pair_speedups"]
        assert abs(pair - phase["speedup"]) <= 0.01
    for mode in ("sequential", "parallel"):
        assert len(fig7[mode]["round_ms"]) == 2 and fig7[mode]["median_ms"] > 0
        assert all(0 <= share <= 1 for share in fig7[mode]["cpu_busy"].values() if share is not None)
        assert fig7[mode]["bench_vm_hwm_mb"] > 100  # the ~334k-triple store is in this process
    assert fig7["parallel"]["boosters_vm_hwm_mb_sum"] > 100  # and in the worker's replica
    assert len(fig7["parallel"]["boosters_vm_hwm_mb"]) == 1 and "boosters_vm_hwm_mb" not in fig7["sequential"]


def test_both_modes_deliver_identical_notifications(small_run: tuple[int, dict[str, Any]]) -> None:
    _, report = small_run
    fig7 = report["fig7"]
    assert fig7["sequential"]["notifications"] == fig7["parallel"]["notifications"] == 2  # S_ROAD(300), per round
    assert fig7["rows_equal"] and fig7["notifications_ok"]
    # 12 updates: roads 1..5's lamps (S_LAMP, 10 a road for ROAD, lamp 1 for LAMP), then road 6's S_ROAD(6)
    for name, expected in (("ROAD", 5 * 10 + 1), ("LAMP", 5 + 1)):
        phase = report[name]
        assert phase["n"] == 12 and phase["m"] == 1004 and phase["notifications_ok"]
        assert [run["mode"] for run in phase["runs"]] == ["sequential", "parallel"]
        for run in phase["runs"]:
            assert (run["notifications"], run["expected_notifications"]) == (expected, expected)
            assert run["unexpected_notifications"] == run["missing_notifications"] == run["late_notifications"] == 0
        assert phase["speedup"] == report["bars"][f"{name.lower()}_speedup"]["value"] > 0
