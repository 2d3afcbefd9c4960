"""Acknowledged means durable: an update is answered only once its journal record is on stable
storage, a delayed update only once its row is, a CoAP reading's 2.04 only once its record is (MQTT
readings take the same path: the ingestor acknowledges a batch once its commit has returned).

The harness traces the gateway's system calls (strace attached to every thread) and checks, in
the order the kernel saw them, that when a reply acknowledging an update starts to be sent, every
write to the journal that had completed was covered by an fdatasync that had completed. Why that
is equivalent to cutting the power: a power cut loses exactly the writes not yet synced, and the
journal's records are replayed at start (tests/broker/test_store.py); so an acknowledged update
can be lost only if a reply went out while its record was unsynced, which is what is checked.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tools.coap import libcoap
from tools.launcher import RunningGateway

_CALL = re.compile(r"^(\d+)\s+(?:<\.\.\. (\w+) resumed>|(\w+)\((\d+)<([^>]*)>)(.*)$")


def _traced(gateway: RunningGateway, trace: Path, *, strings: int = 1024) -> subprocess.Popen[bytes]:
    """strace on every thread of the gateway, showing the first `strings` bytes of each write (an
    update's reply has ~240 bytes of headers before the counts it is found by)."""
    if shutil.which("strace") is None:
        pytest.fail("strace is not installed (tests/run.sh installs it)", pytrace=False)
    argv = ["strace", "-f", "-y", "-s", str(strings), "-o", str(trace)]
    argv += ["-e", "trace=write,pwrite64,fdatasync,fsync,sendto,sendmsg,writev"]
    for thread in _threads(gateway.process.pid):
        argv += ["-p", thread]
    tracer = subprocess.Popen(argv, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached
    return tracer


def _threads(pid: int) -> list[str]:
    """Every thread of `pid` and of the processes it started (the journal's sync helper among
    them, should it be running already: strace -f follows only what starts once attached)."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:  # a child that has just ended (the sync helper a test killed, not reaped yet)
        return []
    children = [child for thread in threads for child in _children(pid, thread)]
    return threads + [thread for child in children for thread in _threads(child)]


def _children(pid: int, thread: str) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{thread}/children").read_text().split()]
    except OSError:  # the thread or process has just ended
        return []


def _sync_helper(pid: int) -> int:
    """The pid of the gateway's journal sync helper (broker.journal_sync)."""
    for thread in os.listdir(f"/proc/{pid}/task"):
        for child in _children(pid, thread):
            if b"fdatasync" in Path(f"/proc/{child}/cmdline").read_bytes():
                return child
    raise AssertionError("the gateway runs no journal sync helper")


# a journal: apply.journal on RocksDB, apply.journal.0 or .1 resident (broker.store)
_JOURNAL = r"apply\.journal(?:\.\d)?>"
_RECORD = re.compile(r"write\(\d+<([^>]*" + _JOURNAL + r'), "SEPA-DELTA 0 (\d+) ')
_SYNC = re.compile(r"sync\(\d+<([^>]*" + _JOURNAL + ")")
_REPLY = re.compile(r'sendto\(\d+<socket:[^>]*>, "HTTP/1\.1 200 OK.*\{\\"added\\": (\d+),')
LINE = len('<urn:x:0000> <urn:p> "0000" .\n')  # every quad of the test has this N-Quads length


def unsynced_acknowledgements(trace: str) -> list[int]:
    """The sizes (quads added) of updates whose 200 reply started before a sync of the journal that
    covered their record had completed. Each update of the test adds a different number of quads
    of one N-Quads length, so the record's byte length names its update, and the reply's "added".
    A sync covers the records of its own file only (a resident store has two journals)."""
    completed: list[tuple[int, str]] = []  # (size, file) of the records whose write had completed, in order
    writing: dict[str, tuple[int, str]] = {}  # thread -> the record it is writing
    syncing: dict[str, tuple[int, str]] = {}  # thread -> (completed records when it began, its file)
    durable: set[int] = set()  # sizes of the records synced
    late: list[int] = []

    def synced(covered: int, file: str) -> None:
        durable.update(size for size, written in completed[:covered] if written == file)

    for line in trace.splitlines():
        thread = line.split(" ", 1)[0]
        record = _RECORD.search(line)
        sync = _SYNC.search(line)
        if record is not None:
            entry = (int(record.group(2)) // LINE, record.group(1))
            if "<unfinished" in line:
                writing[thread] = entry
            else:
                completed.append(entry)
        elif "<... write resumed>" in line and thread in writing:
            completed.append(writing.pop(thread))
        elif sync is not None:
            if "<unfinished" in line:
                syncing[thread] = (len(completed), sync.group(1))
            elif line.rstrip().endswith("= 0"):
                synced(len(completed), sync.group(1))
        elif "sync resumed>" in line and thread in syncing:
            covered, file = syncing.pop(thread)
            if line.rstrip().endswith("= 0"):
                synced(covered, file)
        else:
            reply = _REPLY.search(line)
            if reply is not None and int(reply.group(1)) not in durable:
                late.append(int(reply.group(1)))
    return late


@pytest.mark.parametrize("resident", [True, False], ids=["resident", "rocksdb"])
def test_updates_are_acknowledged_only_once_their_journal_is_synced(
    start_gateway, tmp_path: Path, resident: bool
) -> None:
    toml = None if resident else "[store]\nresident = false\n"
    gateway = start_gateway(data_dir=tmp_path / "data", toml=toml)
    trace = tmp_path / "trace.txt"
    tracer = _traced(gateway, trace)
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:  # concurrent: batches share a sync
            replies = list(pool.map(lambda size: _insert(gateway, size), range(1, SIZES + 1)))
        scheduled = gateway.update("INSERT DATA { <urn:later> <urn:p> 1 }", params=[("delay", "60000")])
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(10)
    assert replies == [200] * SIZES and scheduled.status == 202, scheduled.body
    text = trace.read_text(errors="replace")
    records = len(_RECORD.findall(text))
    syncs = len(re.findall(r"fdatasync\(\d+<[^>]*" + _JOURNAL, text))
    assert records >= SIZES and 1 <= syncs <= records, (records, syncs)
    # the inline updates' syncs are the helper's, not a thread's of the gateway
    helper = _sync_helper(gateway.process.pid)
    assert any(line.startswith(f"{helper} ") and "fdatasync(" in line for line in text.splitlines())
    assert len(_REPLY.findall(text)) == SIZES
    assert unsynced_acknowledgements(text) == []
    # the checker can fail: the same trace with the journal's syncs taken out
    unsynced = "\n".join(line for line in text.splitlines() if "sync" not in line)
    assert len(unsynced_acknowledgements(unsynced)) == SIZES
    # a delayed update's 202 comes after SQLite synced its row (synchronous=FULL): the WAL's sync
    # (fsync or fdatasync) lies between the row's write and the reply
    wal_write = max(
        i
        for i, line in enumerate(text.splitlines())
        if "scheduled.sqlite3-wal>" in line and ("write(" in line or "write64(" in line)
    )
    reply = next(i for i, line in enumerate(text.splitlines()) if "HTTP/1.1 202" in line)
    between = text.splitlines()[wal_write:reply]
    assert any("sync(" in line and "scheduled.sqlite3-wal>" in line for line in between)


SIZES = 60


def _insert(gateway: RunningGateway, size: int) -> int:
    """INSERT DATA of `size` quads, each of N-Quads length LINE."""
    quads = " ".join(f'<urn:x:{size:02d}{index:02d}> <urn:p> "{index:04d}" .' for index in range(size))
    return gateway.update(f"INSERT DATA {{ {quads} }}").status


def test_once_the_sync_helper_is_gone_updates_are_still_acknowledged_only_when_synced(
    start_gateway, tmp_path: Path
) -> None:
    gateway = start_gateway(data_dir=tmp_path / "data")
    assert _insert(gateway, 1) == 200  # starts the helper
    helper = _sync_helper(gateway.process.pid)
    os.kill(helper, signal.SIGKILL)
    trace = tmp_path / "trace.txt"
    tracer = _traced(gateway, trace)
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            replies = list(pool.map(lambda size: _insert(gateway, size), range(2, SIZES + 1)))
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(10)
    assert replies == [200] * (SIZES - 1)
    text = trace.read_text(errors="replace")
    assert len(_REPLY.findall(text)) == SIZES - 1
    assert re.search(r"fdatasync\(\d+<[^>]*" + _JOURNAL, text)
    assert unsynced_acknowledgements(text) == []
    assert gateway.query("ASK { <urn:x:6059> <urn:p> ?o }").json()["boolean"] is True


# a CoAP 2.04 Changed acknowledgement: version 1, type ACK, a token of 0-8 bytes (0x60-0x68), code 0x44
_COAP_CHANGED = re.compile(r'send(?:to|msg)\(\d+<socket:\[\d+\]>, .*?"[`a-h]D')


def acknowledged_before_synced(trace: str, values: list[str]) -> list[str]:
    """The readings (by the text of their value) whose 2.04 went out before a sync of the journal
    started after their record was written had completed. Readings are sent one at a time, so the
    first 2.04 after a reading's record is its own."""
    lines = trace.splitlines()
    late = []
    for value in values:
        start = next(
            i for i, line in enumerate(lines) if re.search(_JOURNAL, line) and "write(" in line and value in line
        )
        written = start
        if "<unfinished" in lines[start]:
            thread = lines[start].split(" ", 1)[0]
            written = next(i for i in range(start, len(lines)) if _resumes(lines[i], thread, "write"))
        reply = next(i for i in range(written, len(lines)) if _COAP_CHANGED.search(lines[i]))
        if not any(_synced_between(lines, i, reply) for i in range(written + 1, reply) if _sync_starts(lines[i])):
            late.append(value)
    return late


def _resumes(line: str, thread: str, call: str) -> bool:
    """Whether `line` is `thread`'s `call` resumed. strace pads the pid to 5 columns: a 4-digit
    thread's lines are "6723  <... fdatasync resumed>", and a test that looked for one space failed
    whenever the journal's thread had a pid under 10,000 and its sync was interrupted (2 of 5 runs at
    load 7: a reading acknowledged after its sync was taken for one acknowledged before)."""
    return re.match(rf"{thread}\s+<\.\.\. {call} resumed>", line) is not None


def _sync_starts(line: str) -> bool:
    return _SYNC.search(line) is not None


def _synced_between(lines: list[str], start: int, before: int) -> bool:
    """Whether the journal sync starting at `start` completed (= 0) before line `before`."""
    if "<unfinished" not in lines[start]:
        return lines[start].rstrip().endswith("= 0")
    thread = lines[start].split(" ", 1)[0]
    return any(
        _resumes(lines[i], thread, r"\w*sync") and lines[i].rstrip().endswith("= 0") for i in range(start + 1, before)
    )


def test_coap_readings_are_acknowledged_only_once_their_journal_is_synced(start_gateway, tmp_path: Path) -> None:
    """A reading takes the update thread's path (a batch, synced once it ran), not the inline one:
    each 2.04 from libcoap's coap-client must follow a completed sync begun after its record."""
    if libcoap.coap_client() is None:
        pytest.fail(libcoap.MISSING, pytrace=False)
    gateway = start_gateway(data_dir=tmp_path / "data", coap=True)
    values = [f"{6000 + index}.25" for index in range(8)]
    trace = tmp_path / "trace.txt"
    tracer = _traced(gateway, trace, strings=1 << 16)  # the whole record: the value is far into it
    try:
        for value in values:
            done = libcoap.run(["-m", "post", "-t", "0", "-e", value, f"{gateway.coap_url}/s/boiler/temperature"])
            assert libcoap.succeeded(done), done
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(10)
    text = trace.read_text(errors="replace")
    assert len([line for line in text.splitlines() if _COAP_CHANGED.search(line)]) == len(values)
    assert acknowledged_before_synced(text, values) == []
    # the checker can fail: the same trace with the journal's syncs taken out
    unsynced = "\n".join(line for line in text.splitlines() if "sync" not in line)
    assert acknowledged_before_synced(unsynced, values) == values


def _start_on(gateway_command: list[str], data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`sepa-gateway run` on `data`, for a start that must be refused (it exits; one that serves
    runs until the timeout)."""
    argv = [*gateway_command, "run", "--host", "127.0.0.1", "--http-port", "0", "--ws-port", "0"]
    argv += ["--https-port", "0", "--wss-port", "0", "--no-mqtt", "--no-coap", "--data-dir", str(data), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_a_second_gateway_on_the_same_data_directory_is_refused(
    start_gateway, gateway_command: list[str], tmp_path: Path
) -> None:
    """Two gateways on one directory both ran, and one's acknowledged updates were gone after a
    restart (the first wrote its journal records over the second's); the second is refused, naming
    the directory and the first's pid, and a kill -9 of the first frees the directory at once."""
    data = tmp_path / "data"
    first = start_gateway(data_dir=data)
    assert first.update('INSERT DATA { <urn:a> <urn:p> "via the first" }').status == 200
    second = _start_on(gateway_command, data)
    assert second.returncode != 0
    assert f"{data} is in use by another process (pid {first.process.pid}," in second.stderr
    assert "Traceback" not in second.stderr
    assert first.update('INSERT DATA { <urn:c> <urn:p> "via the first again" }').status == 200
    first.process.kill()
    first.process.wait()
    restarted = start_gateway(data_dir=data)
    rows = restarted.query("SELECT ?s WHERE { ?s <urn:p> ?o }").json()["results"]["bindings"]
    assert sorted(row["s"]["value"] for row in rows) == ["urn:a", "urn:c"]


def test_a_damaged_journal_is_refused_in_one_line_naming_the_file_and_the_offset(
    start_gateway, gateway_command: list[str], tmp_path: Path
) -> None:
    """One byte of a quad changed in the middle of the journal: the start was a raw traceback
    (SyntaxError: Invalid IRI code point, from the journal's decoding), naming neither the file nor
    where, and systemd restarted it in a loop; a damaged header silently cut the journal there."""
    data = tmp_path / "data"
    gateway = start_gateway(data_dir=data)
    for index in range(5):
        assert gateway.update(f"INSERT DATA {{ <urn:s{index}> <urn:p> {index} }}").status == 200
    gateway.process.kill()
    gateway.process.wait()
    journal = max(data.glob("apply.journal.*"), key=lambda path: path.stat().st_size)
    text = journal.read_bytes()
    at = text.index(b"<urn:s2>")
    journal.write_bytes(text[: at + 1] + b" " + text[at + 2 :])
    refused = _start_on(gateway_command, data)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr
    record = text.rindex(b"SEPA-DELTA", 0, at)
    assert f"{journal} is damaged at byte {record} of {len(text)} (" in refused.stderr
    assert journal.read_bytes() == text[: at + 1] + b" " + text[at + 2 :]


_GARBAGE = b"\x8f garbage " * 20
_KEYS = ["security/token-signing-key.pem", "security/tls-cert.pem", "security/tls-key.pem"]


# an empty scheduled.sqlite3 is an empty database (SQLite's own), and it starts
@pytest.mark.parametrize(
    ("name", "damage"),
    [("scheduled.sqlite3", _GARBAGE)] + [(key, damage) for key in _KEYS for damage in (b"", _GARBAGE)],
)
def test_a_damaged_file_of_the_data_directory_is_refused_in_one_line_naming_it(
    start_gateway, gateway_command: list[str], tmp_path: Path, name: str, damage: bytes
) -> None:
    """The delayed updates' database was a raw traceback (sqlite3.DatabaseError: file is not a
    database); a damaged key or certificate said cryptography's 'Unable to load PEM file ...
    MalformedFraming', naming none of the three files it could be."""
    data = tmp_path / "data"
    start_gateway("--secure", data_dir=data).stop(signal.SIGTERM)
    (data / name).write_bytes(damage)
    refused = _start_on(gateway_command, data, "--secure")
    assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr
    said = [line for line in refused.stderr.splitlines() if line.startswith("sepa-gateway: ")]
    assert len(said) == 1 and str(data / name) in said[0], refused.stderr
    assert (data / name).read_bytes() == damage  # refused, not replaced


@pytest.mark.parametrize("damage", [b"", _GARBAGE])
def test_a_snapshot_without_its_header_is_refused_in_one_line_naming_it_and_the_way_out(
    start_gateway, gateway_command: list[str], tmp_path: Path, damage: bytes
) -> None:
    """An empty snapshot.nq (a copy or a restore that failed) or one of garbage: refused in one line
    naming the file and what to do. Before, the line said only that it was not a snapshot this
    gateway wrote."""
    data = tmp_path / "data"
    gateway = start_gateway(data_dir=data)
    assert gateway.update("INSERT DATA { <urn:s> <urn:p> 1 }").status == 200
    gateway.stop(signal.SIGTERM)
    (data / "snapshot.nq").write_bytes(damage)
    refused = _start_on(gateway_command, data)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    said = [line for line in refused.stderr.splitlines() if line.startswith("sepa-gateway: ")]
    assert len(said) == 1 and str(data / "snapshot.nq") in said[0], refused.stderr
    assert "restore it from a copy" in said[0], said[0]
    assert (data / "snapshot.nq").read_bytes() == damage


@pytest.mark.parametrize("damaged", ["CURRENT", "MANIFEST", "table", "data block"])
def test_a_damaged_rocksdb_store_is_refused_in_one_line_naming_it_and_the_way_out(
    start_gateway, gateway_command: list[str], tmp_path: Path, damaged: str
) -> None:
    """On RocksDB (`[store] resident = false`), a damaged CURRENT, MANIFEST or table file (a disk or a
    copy that failed) was a raw traceback (RuntimeError: Corruption: ...), exit status 1, for
    systemd to restart in a loop; now exit status 2 and one line naming the store and what to do.
    A damaged data block (read only when asked for) was found by the first query worker's count
    of its replica: an EOFError traceback, exit status 1."""
    data, config = tmp_path / "data", tmp_path / "rocksdb.toml"
    config.write_text("[store]\nresident = false\n")
    gateway = start_gateway(config=config, data_dir=data)
    quads = " ".join(f'<urn:s{index}> <urn:p> "{index}" .' for index in range(10_000))
    assert gateway.update(f"INSERT DATA {{ {quads} }}").status == 200
    gateway.stop(signal.SIGTERM)  # flushed: table files hold the quads
    store = data / "store"
    tables = sorted(store.glob("*.sst"), key=lambda path: path.stat().st_size)
    file = {"CURRENT": store / "CURRENT", "MANIFEST": min(store.glob("MANIFEST-*"))}
    target = file.get(damaged) or (tables[0] if damaged == "table" else tables[-1])
    before = target.read_bytes()
    at = len(before) // 4 if damaged == "data block" else 60  # a data block's, or the file's footer read at open
    target.write_bytes(
        before[:at] + _GARBAGE + before[at + len(_GARBAGE) :]
        if damaged == "data block"
        else (before[:at] + _GARBAGE[: len(before) - at] if damaged == "table" else _GARBAGE)
    )
    refused = _start_on(gateway_command, data, "--config", str(config))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    said = [line for line in refused.stderr.splitlines() if line.startswith("sepa-gateway: ")]
    assert len(said) == 1 and f"{store} (RocksDB) is damaged (Corruption:" in said[0], refused.stderr
    assert "restore it from a backup" in said[0], said[0]
