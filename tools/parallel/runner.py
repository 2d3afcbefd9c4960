"""The engine's parallel mode against its sequential mode, in one invocation (issue 19, item 4).

Why one invocation: the machine is shared and noisy, so the two modes are only comparable when
measured side by side, on fresh engines of the same process, the same knowledge base and the same
update stream. Each phase runs the sequential engine (``Engine(mode="sequential")``) and the
parallel one (``Engine(mode="parallel", boosters=workers)``) and reports both, their ratio, and
whether they delivered the same notifications.

Phases:

- **fig7** (seed 001 Fig. 7): the four coarse subscriptions S_ROAD(1), S_ROAD(100), S_ROAD(200),
  S_ROAD(300) on the ~334k-triple knowledge base; the ten updates U_ROAD(300) .. U_ROAD(309) are
  submitted without waiting in between (pipelined), then waited for. T_ELAPSED of a round is from
  the first submission to the completion of the last update. Ten updates take ~100 ms, so the round
  is repeated R times on the same engine, round r setting the dimming value ``"<100 + r>"`` (the
  knowledge base never holds "100" or more, and each round's value differs from the last), so every
  round really changes road 300's lamps and S_ROAD(300) is notified once per round. Reported: the
  rounds' times, their median and total per mode, and the speedup (sequential median over parallel
  median). Compared: the notifications of the two modes as a multiset of (alias, sequence, sorted
  added rows, sorted removed rows); spuids differ between engines, aliases do not.
- **ROAD** and **LAMP** (seed 001 §V): profile S's 1,004 subscriptions, the 310 updates of each
  experiment submitted pipelined (all submitted, then waited for), each run on a fresh engine with
  the procedure of :mod:`tools.lighting.runner` (its ``prepare`` / ``issue`` / ``finish``, so the
  notifications are attributed to updates and checked against the profile's expected ones by the
  same code as ``bench lighting``). Each mode runs `repeats` times, alternating sequential and
  parallel, and the medians are reported: elapsed, updates/s, and the speedup (parallel ups over
  sequential ups).
- **wire**: ``bench wire`` (:func:`tools.wire.runner.run`, Oxigraph's baseline on) with the gateway
  in sequential mode, then in parallel mode; each run's ups, its ratio to the Oxigraph ups of the
  same run, and its wrong and missing notifications.

For every phase: the worker count, the busy fraction of each core (from ``/proc/stat``) over the
measured updates of each run and over the whole phase (loading and subscribing included), and
memory. In-process memory is this process's VmHWM, a high-water mark of the whole invocation (so
it can only grow from phase to phase), plus each BOOSTER worker's own VmHWM read before its engine
is closed, and their sum. ``tools.wire`` reports no memory of its gateway, so the wire phase has
none.

Each phase also reports ``pair_speedups``: the speedup of each alternated pair (fig7: of the two
runs' median rounds), so that a reader sees how far the machine moved during the invocation: on
the shared 2-core test machine the same pure-Python loop took 1.7-2.4 s from one minute to the
next, and one invocation's ROAD pairs ranged 0.93-1.73x.

Bars (issue 19): fig7 speedup >= 1.5, ROAD speedup >= 1.4, LAMP speedup >= 0.9 (a single lamp per
update leaves the workers nothing to share, it must only not cost much), and the parallel gateway
at >= 0.8 of Oxigraph's ups. A bar not met is reported, not an error.
"""

from __future__ import annotations

import gc
import os
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.api import Engine, Notification, UpdateResult
from tools.lighting import runner as lighting
from tools.lighting.profiles import DIMMING_SET_BY_UPDATES, Experiment, experiment, s_road, u_road

Log = Callable[[str], None]
CpuTimes = dict[str, tuple[int, int]]  # per core: (busy, total) jiffies
NotificationKey = tuple[str, int, tuple[tuple[str, ...], ...], tuple[tuple[str, ...], ...]]

MODES = ("sequential", "parallel")
EXPERIMENTS = ("ROAD", "LAMP")
FIG7_ROADS = (1, 100, 200, 300)
FIG7_UPDATED_ROADS = tuple(range(300, 310))
FIG7_NOTIFIED = "S_ROAD(300)"  # the only subscription of the four whose road the updates change
BARS = {"fig7_speedup": 1.5, "road_speedup": 1.4, "lamp_speedup": 0.9, "wire_parallel_ratio": 0.8}
WIRE_RSS_NOTE = "tools.wire reports no memory of its gateway or Oxigraph processes"


def default_workers() -> int:
    """One BOOSTER worker per core this process may run on, less the engine's own."""
    return max(1, len(os.sched_getaffinity(0)) - 1)


@dataclass(frozen=True)
class ParallelOptions:
    """What one invocation runs; the defaults are the benchmark's."""

    workers: int = field(default_factory=default_workers)
    rounds: int = 20  # fig7: rounds of the ten updates on one engine
    repeats: int = 3  # fig7, ROAD and LAMP: runs of each mode, alternating
    updates: int | None = None  # ROAD and LAMP: only the first this many updates (tests); None: all 310
    wire_updates: int = 3000
    skip_wire: bool = False


# -- measuring the machine -------------------------------------------------------------------------


def cpu_times() -> CpuTimes:
    """Per core (``cpu0``, ``cpu1`` ...): jiffies busy and in all, since boot, from /proc/stat."""
    times: CpuTimes = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        values = [int(value) for value in fields[:8]]  # user nice system idle iowait irq softirq steal
        total = sum(values)
        times[name] = (total - values[3] - values[4], total)
    return times


def cpu_busy(before: CpuTimes, after: CpuTimes) -> dict[str, float | None]:
    """Each core's busy fraction between two readings (None if no tick passed)."""
    busy: dict[str, float | None] = {}
    for name, (busy_after, total_after) in after.items():
        busy_before, total_before = before.get(name, (0, 0))
        ticks = total_after - total_before
        busy[name] = round((busy_after - busy_before) / ticks, 3) if ticks > 0 else None
    return busy


def vm_hwm_mb(pid: int | str = "self") -> float | None:
    """A process's peak resident memory (VmHWM), in MB; None if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return None


def engine_extras(engine: Engine) -> dict[str, Any]:
    """A parallel engine's BOOSTER workers' peak memory and its pipeline counters; nothing for a
    sequential one. Read before the engine is closed: closing ends the workers."""
    boosters = getattr(engine.spus, "boosters", None)
    if boosters is None:
        return {}
    peaks = [vm_hwm_mb(worker.process.pid) for worker in boosters]
    return {
        "boosters_vm_hwm_mb": peaks,
        "boosters_vm_hwm_mb_sum": round(sum(peak for peak in peaks if peak is not None), 1),
        "counters": dict(getattr(engine.spus, "counters", {})),
    }


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return round(numerator / denominator, 3) if numerator and denominator else None


def _engine(mode: str, workers: int) -> Engine:
    return Engine(mode=mode, boosters=workers) if mode == "parallel" else Engine(mode=mode)


# -- fig7 ------------------------------------------------------------------------------------------


def fig7_update(road: int, round_: int) -> str:
    """U_ROAD(road) setting the dimming value "<100 + round_>" instead of the profile's "100"."""
    marker = f'"{DIMMING_SET_BY_UPDATES}"'
    text = u_road(road)
    if text.count(marker) != 1:  # the profile's text changed: the rounds would not change the lamps
        raise ValueError(f"U_ROAD({road}) does not set {marker} exactly once")
    return text.replace(marker, f'"{100 + round_}"')


def _rows(rows: Any) -> tuple[tuple[str, ...], ...]:
    return tuple(sorted(tuple(str(term) for term in row) for row in rows))


class NotificationLog:
    """Every notification after the sequence-0 reply, as a comparable key (alias, not spuid)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.keys: Counter[NotificationKey] = Counter()

    def __call__(self, notification: Notification) -> None:
        if notification.sequence == 0:
            return
        key = (notification.alias or "", notification.sequence, _rows(notification.added), _rows(notification.removed))
        with self._lock:
            self.keys[key] += 1

    @property
    def count(self) -> int:
        return sum(self.keys.values())


def fig7_mode(mode: str, options: ParallelOptions, say: Log) -> tuple[dict[str, Any], NotificationLog]:
    """One mode of fig7 on a fresh engine: its report and its notifications."""
    engine = _engine(mode, options.workers)
    notes = NotificationLog()
    try:
        started = time.perf_counter()
        triples = lighting.load_knowledge_base(engine)  # before subscribing: the workers snapshot the store then
        load_s = time.perf_counter() - started
        started = time.perf_counter()
        for road in FIG7_ROADS:
            engine.subscribe(s_road(road), notes, alias=f"S_ROAD({road})")
        subscribe_s = time.perf_counter() - started
        say(f"fig7/{mode}: {triples:,} triples loaded in {load_s:.1f} s, subscribed in {subscribe_s:.1f} s")
        before = cpu_times()
        round_ms: list[float] = []
        for round_ in range(options.rounds):
            texts = [fig7_update(road, round_) for road in FIG7_UPDATED_ROADS]
            started = time.perf_counter()
            futures: list[Future[UpdateResult]] = [engine.submit(text) for text in texts]
            for future in futures:
                future.result()
            round_ms.append((time.perf_counter() - started) * 1000)
        cpu = cpu_busy(before, cpu_times())
        report: dict[str, Any] = {
            "round_ms": [round(ms, 3) for ms in round_ms],
            "median_ms": round(statistics.median(round_ms), 3) if round_ms else None,
            "total_ms": round(sum(round_ms), 3),
            "notifications": notes.count,
            "load_s": round(load_s, 2),
            "subscribe_s": round(subscribe_s, 2),
            "cpu_busy": cpu,
            **engine_extras(engine),
        }
    finally:
        engine.close()
    report["bench_vm_hwm_mb"] = vm_hwm_mb()
    say(f"fig7/{mode}: median round {report['median_ms']} ms, {notes.count} notifications")
    return report, notes


def run_fig7(options: ParallelOptions, say: Log) -> dict[str, Any]:
    """Both modes of fig7, `repeats` times alternating, their medians over every round, the speedup
    and whether they notified alike. Why alternating: with one pass each, the second engine of the
    process ran slower whatever its mode (on one core, where parallel mode starts no worker and so
    is sequential mode, its median round took 110 ms against the first's 86)."""
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    notes: dict[str, list[NotificationLog]] = {mode: [] for mode in MODES}
    for _ in range(options.repeats):
        for mode in MODES:
            report, log = fig7_mode(mode, options, say)
            runs[mode].append(report)
            notes[mode].append(log)
            gc.collect()
    by_mode: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        rounds = [ms for report in runs[mode] for ms in report["round_ms"]]
        by_mode[mode] = {**runs[mode][-1], "median_ms": round(statistics.median(rounds), 3), "runs": len(runs[mode])}
    expected = options.rounds
    equal = all(seq.keys == par.keys for seq, par in zip(notes["sequential"], notes["parallel"], strict=True))
    counted = [
        sum(n for key, n in log.keys.items() if key[0] == FIG7_NOTIFIED) for logs in notes.values() for log in logs
    ]
    counts = [log.count for logs in notes.values() for log in logs]
    return {
        "subscriptions": [f"S_ROAD({road})" for road in FIG7_ROADS],
        "updates": [f"U_ROAD({road})" for road in FIG7_UPDATED_ROADS],
        "rounds": options.rounds,
        "repeats": options.repeats,
        "workers": options.workers,
        **by_mode,
        "speedup": _ratio(by_mode["sequential"]["median_ms"], by_mode["parallel"]["median_ms"]),
        "pair_speedups": [
            _ratio(seq["median_ms"], par["median_ms"])
            for seq, par in zip(runs["sequential"], runs["parallel"], strict=True)
        ],
        "expected_notifications": expected,
        "notifications_equal": len(set(counts)) == 1,
        "rows_equal": equal,
        "notifications_ok": equal and all(count == expected for count in counts + counted),
    }


# -- ROAD and LAMP ---------------------------------------------------------------------------------


def profile_experiment(name: str, updates: int | None) -> Experiment:
    """Experiment `name` with profile S, cut to its first `updates` updates (its expected
    notifications follow: they are derived from the updates kept)."""
    exp = experiment(name)
    return exp if updates is None else Experiment(exp.name, exp.updates[:updates], exp.subscriptions)


def experiment_run(exp: Experiment, mode: str, workers: int, say: Log) -> dict[str, Any]:
    """One pipelined run of `exp` in `mode` on a fresh engine, by the lighting runner's procedure."""
    run = lighting.prepare(exp, mode, boosters=workers, log=say)
    try:
        before = cpu_times()
        lighting.issue(run, pipelined=True, log=say)
        cpu = cpu_busy(before, cpu_times())
        extras = engine_extras(run.engine)
    finally:
        run.engine.close()
    kpis = lighting.finish(run)
    del run
    gc.collect()
    return {
        "mode": mode,
        "elapsed_s": round(kpis["t_total_s"], 4),
        "ups": round(kpis["ups"], 1) if kpis["ups"] else None,
        "notifications": kpis["notifications"],
        "expected_notifications": kpis["expected_notifications"],
        "unexpected_notifications": kpis["unexpected_notifications"],
        "missing_notifications": kpis["missing_notifications"],
        "late_notifications": kpis["late_notifications"],
        "counts_ok": kpis["counts_ok"],
        "nl_max_ms": round(kpis["nl_max_ms"], 3) if kpis["nl_max_ms"] is not None else None,
        "load_s": round(kpis["load_s"], 2),
        "subscribe_s": round(kpis["subscribe_s"], 2),
        "cpu_busy": cpu,
        "bench_vm_hwm_mb": vm_hwm_mb(),
        **extras,
    }


def run_experiment(name: str, options: ParallelOptions, say: Log) -> dict[str, Any]:
    """`repeats` runs of each mode, alternating, and their medians; speedup = parallel ups over sequential."""
    exp = profile_experiment(name, options.updates)
    runs: list[dict[str, Any]] = []
    for repeat in range(options.repeats):
        for mode in MODES:
            result = experiment_run(exp, mode, options.workers, say)
            say(
                f"{name}/{mode} #{repeat + 1}: {result['elapsed_s']:.2f} s, {result['ups']} ups, "
                f"{result['unexpected_notifications']} unexpected, {result['missing_notifications']} missing"
            )
            runs.append({"repeat": repeat + 1, **result})
    medians: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        mine = [run for run in runs if run["mode"] == mode]
        medians[mode] = {
            "elapsed_s": _median([run["elapsed_s"] for run in mine]),
            "ups": _median([run["ups"] for run in mine if run["ups"] is not None]),
        }
    return {
        "n": exp.n,
        "m": exp.m,
        "workers": options.workers,
        "repeats": options.repeats,
        **medians,
        "speedup": _ratio(medians["parallel"]["ups"], medians["sequential"]["ups"]),
        "pair_speedups": [
            _ratio(par["ups"], seq["ups"])
            for seq, par in zip(runs[0::2], runs[1::2], strict=True)  # the runs alternate, sequential first
        ],
        "notifications_ok": all(run["counts_ok"] for run in runs),
        "runs": runs,
    }


# -- wire ------------------------------------------------------------------------------------------

WIRE_KEYS = (
    "ups",
    "oxigraph_ups",
    "ratio",
    "nl_p50_ms",
    "nl_p99_ms",
    "failed_updates",
    "notifications",
    "expected_notifications",
    "wrong_notifications",
    "missing_notifications",
    "unexpected_notifications",
)


def run_wire(options: ParallelOptions, say: Log) -> dict[str, Any]:
    """``bench wire`` with the gateway sequential, then parallel; each with its own Oxigraph baseline."""
    from tools.wire.runner import WireOptions
    from tools.wire.runner import run as wire

    out: dict[str, Any] = {"updates": options.wire_updates, "workers": options.workers}
    for mode in MODES:
        before = cpu_times()
        result = wire(
            WireOptions(updates=options.wire_updates, mode=mode, workers=options.workers if mode == "parallel" else 0),
            lambda message, mode=mode: say(f"wire/{mode}: {message}"),
        )
        out[mode] = {key: result.get(key) for key in WIRE_KEYS}
        out[mode]["cpu_busy"] = cpu_busy(before, cpu_times())
        out[mode]["rss_mb"] = None
    out["rss_note"] = WIRE_RSS_NOTE
    out["parallel_over_sequential"] = _ratio(out["parallel"]["ups"], out["sequential"]["ups"])
    out["notifications_ok"] = all(
        out[mode][key] == 0
        for mode in MODES
        for key in ("wrong_notifications", "missing_notifications", "unexpected_notifications", "failed_updates")
    )
    return out


# -- the whole benchmark ---------------------------------------------------------------------------


def _phase(name: str, body: Callable[[], dict[str, Any]], say: Log) -> dict[str, Any]:
    """One phase, with the CPU and memory it took; a phase that raises is reported as its error."""
    before = cpu_times()
    started = time.perf_counter()
    try:
        report = body()
    except Exception as error:  # a benchmark reports a failed phase, the others' figures survive it
        say(f"{name}: failed: {type(error).__name__}: {error}")
        return {"error": f"{type(error).__name__}: {error}"}
    report["phase_s"] = round(time.perf_counter() - started, 2)
    report["cpu_busy_phase"] = cpu_busy(before, cpu_times())
    report["bench_vm_hwm_mb"] = vm_hwm_mb()
    return report


def _bar(value: float | None, bar: float) -> dict[str, Any]:
    """A bar of issue 19: met is None when the phase was skipped or failed."""
    return {"value": value, "bar": bar, "met": None if value is None else value >= bar}


def bars(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    wire = report["wire"]
    wire_parallel = wire.get("parallel") or {}
    return {
        "fig7_speedup": _bar(report["fig7"].get("speedup"), BARS["fig7_speedup"]),
        "road_speedup": _bar(report["ROAD"].get("speedup"), BARS["road_speedup"]),
        "lamp_speedup": _bar(report["LAMP"].get("speedup"), BARS["lamp_speedup"]),
        "wire_parallel_ratio": _bar(wire_parallel.get("ratio"), BARS["wire_parallel_ratio"]),
    }


def run(options: ParallelOptions, log: Log | None = None) -> dict[str, Any]:
    """Every phase, sequential vs parallel; the JSON document of ``bench parallel``."""
    say = log or (lambda _message: None)
    if options.workers < 1 or options.rounds < 1 or options.repeats < 1:
        raise ValueError("workers, rounds and repeats must be at least 1")
    say(f"bench parallel: {options.workers} BOOSTER worker(s), {len(os.sched_getaffinity(0))} core(s)")
    report: dict[str, Any] = {"workers": options.workers, "cores": len(os.sched_getaffinity(0))}
    report["fig7"] = _phase("fig7", lambda: run_fig7(options, say), say)
    for name in EXPERIMENTS:
        report[name] = _phase(name, lambda name=name: run_experiment(name, options, say), say)
    if options.skip_wire:
        report["wire"] = {"skipped": True}
    else:
        report["wire"] = _phase("wire", lambda: run_wire(options, say), say)
    report["bars"] = bars(report)
    return report


def errors(report: dict[str, Any]) -> list[str]:
    """The phases that failed."""
    return [name for name in ("fig7", *EXPERIMENTS, "wire") if "error" in report.get(name, {})]


def notifications_ok(report: dict[str, Any]) -> bool:
    """Every phase that ran delivered the notifications it had to, the same in both modes."""
    phases = [report[name] for name in ("fig7", *EXPERIMENTS, "wire") if name in report]
    return all(phase.get("notifications_ok", True) for phase in phases if "error" not in phase)


def exit_code(report: dict[str, Any], *, strict: bool = False) -> int:
    """0 unless a phase failed, or (`strict`) notifications differ; a bar not met is not an error."""
    if errors(report):
        return 1
    return 1 if strict and not notifications_ok(report) else 0


def format_summary(report: dict[str, Any]) -> str:
    """A few lines for a human: each bar, and whether the notifications agreed."""
    lines = [f"workers {report['workers']}, cores {report['cores']}"]
    phases = {"fig7_speedup": "fig7", "road_speedup": "ROAD", "lamp_speedup": "LAMP"}
    for name, entry in report["bars"].items():
        verdict = "n/a" if entry["met"] is None else "met" if entry["met"] else "NOT met"
        pairs = report.get(phases.get(name, ""), {}).get("pair_speedups")
        spread = f"  (pairs {min(pairs)}-{max(pairs)})" if pairs and None not in pairs else ""
        lines.append(f"{name:<22} {entry['value']!s:>8}  bar {entry['bar']:<4} {verdict}{spread}")
    failed = errors(report)
    lines.append(f"failed phases: {', '.join(failed)}" if failed else "every phase ran")
    lines.append("notifications: " + ("as expected, equal in both modes" if notifications_ok(report) else "DIFFER"))
    return "\n".join(lines)
