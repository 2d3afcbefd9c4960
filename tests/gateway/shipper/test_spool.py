"""The shipper's spool: sealing, the resume cursor, crash recovery, the budget policy."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from gateway.shipper.spool import Spool


def line(sensor: str, sequence: int) -> bytes:
    return (
        json.dumps(
            {"id": f"urn:o:{sensor}:{sequence}", "sensor": sensor, "property": "p", "sequence": sequence}
        ).encode()
        + b"\n"
    )


def open_spool(directory: Path, *, segment_max_bytes: int = 10_000, budget_bytes: int = 1 << 20) -> Spool:
    return Spool.open(directory, segment_max_bytes=segment_max_bytes, budget_bytes=budget_bytes)


def test_a_full_segment_is_sealed_gzipped_and_the_cursor_written(tmp_path: Path) -> None:
    spool = open_spool(tmp_path, segment_max_bytes=200)
    first = [line("s1", 1), line("s2", 1)]
    assert spool.append(first, {"s1 p": 1, "s2 p": 1}) is False and spool.sealed_count == 0
    more = [line("s1", n) for n in range(2, 5)]
    assert spool.append(more, {"s1 p": 4}) is True  # past 200 bytes: sealed
    (segment,) = spool.sealed
    assert gzip.decompress(spool.read(segment)) == b"".join(first + more) and segment.records == 5
    assert segment.path.name == "seg-000000000001-5.jsonl.gz"
    assert json.loads((tmp_path / "cursor.json").read_text()) == {"through": 1, "keys": {"s1 p": 4, "s2 p": 1}}
    assert not list(tmp_path.glob("open-*"))
    assert spool.read(segment) == gzip.compress(b"".join(first + more), compresslevel=1, mtime=0)  # same bytes


def test_a_restart_after_a_kill_cuts_the_torn_line_seals_and_resumes(tmp_path: Path) -> None:
    spool = open_spool(tmp_path)
    spool.append([line("s1", 1), line("s1", 2)], {"s1 p": 2})
    with open(tmp_path / "open-000000000001.jsonl", "ab") as file:
        file.write(b'{"id": "urn:o:s1:3", "sens')  # the kill came mid-write
    # no close(): the process died
    again = open_spool(tmp_path)
    (segment,) = again.sealed
    assert segment.records == 2 and again.cursor == {"s1 p": 2}
    assert gzip.decompress(again.read(segment)) == line("s1", 1) + line("s1", 2)
    again.append([line("s1", 3)], {"s1 p": 3})
    again.seal()
    assert [s.number for s in again.sealed] == [1, 2]  # numbering goes on, never reuses


def test_a_segment_sealed_before_its_cursor_was_written_still_counts(tmp_path: Path) -> None:
    spool = open_spool(tmp_path)
    spool.append([line("s1", 1)], {"s1 p": 1})
    spool.seal()
    # a crash between the sealed file's rename and cursor.json: a later segment with no cursor
    (tmp_path / "seg-000000000002-1.jsonl.gz").write_bytes(gzip.compress(line("s1", 7), mtime=0))
    again = open_spool(tmp_path)
    assert again.cursor == {"s1 p": 7} and again.through == 2 and again.next_number == 3


def test_over_budget_the_oldest_segments_are_dropped_and_counted(tmp_path: Path) -> None:
    spool = open_spool(tmp_path, segment_max_bytes=1024, budget_bytes=4096)
    for n in range(1, 400):
        spool.append([line("s1", n) + b" " * 200], {"s1 p": n})  # whitespace: gzip gains little
    assert spool.dropped_segments > 0 and spool.dropped_observations > 0
    assert spool.backlog_bytes <= 4096 + 1024 + 300  # checked at each seal: one open segment may be over
    survivors = sum(segment.records for segment in spool.sealed) + spool.open_records
    assert survivors + spool.dropped_observations == 399
    assert spool.sealed[0].number > 1


def test_batch_ids_are_stable_per_segment_and_unique_per_spool(tmp_path: Path) -> None:
    spool = open_spool(tmp_path / "a")
    spool.append([line("s1", 1)], {"s1 p": 1})
    spool.seal()
    segment = spool.sealed[0]
    batch = spool.batch_id(segment, "plant room/pi 4")
    assert batch == f"plant-room-pi-4-{spool.id}-000000000001"
    assert open_spool(tmp_path / "a").batch_id(segment, "plant room/pi 4") == batch
    assert open_spool(tmp_path / "b").id != spool.id
    assert spool.batch_id(segment, "_x").startswith("g_x-")


def test_confirmed_segments_are_deleted_rejected_ones_kept_aside(tmp_path: Path) -> None:
    spool = open_spool(tmp_path)
    for n in (1, 2):
        spool.append([line("s1", n)], {"s1 p": n})
        spool.seal()
    first, second = spool.sealed
    spool.confirmed(first)
    kept = spool.reject(second)
    assert not first.path.exists() and kept == tmp_path / "rejected" / second.path.name and kept.exists()
    assert spool.sealed_count == 0 and spool.backlog_observations == 0
    assert open_spool(tmp_path).sealed_count == 0  # a rejected segment is never resent


def test_an_old_open_segment_is_sealed_by_age(tmp_path: Path) -> None:
    spool = open_spool(tmp_path)
    assert spool.seal_if_older(0.0) is False  # nothing open
    spool.append([line("s1", 1)], {"s1 p": 1})
    assert spool.seal_if_older(3600) is False
    assert spool.seal_if_older(0.0) is True and spool.sealed_count == 1


def test_damaged_records_of_an_open_segment_are_skipped_and_counted_the_rest_kept(tmp_path: Path) -> None:
    """A power cut can leave more than a torn last line: a block of zeros where a write never reached
    the disk, or a short write (disk full) with later appends after it. Start-up must still work."""
    spool = open_spool(tmp_path)
    spool.append([line("s1", 1), line("s1", 2)], {"s1 p": 2})
    spool.close()
    with open(tmp_path / "open-000000000001.jsonl", "ab") as file:
        file.write(b"\0" * 300 + b"\n")  # a block that never reached the disk
        file.write(b'{"id": "urn:o:s1:3", "sens' + line("s1", 4))  # a short write, then an append
        file.write(b"[1, 2]\n" + line("s2", 1))
    again = open_spool(tmp_path)
    (segment,) = again.sealed
    assert gzip.decompress(again.read(segment)) == line("s1", 1) + line("s1", 2) + line("s2", 1)
    assert segment.records == 3 and again.damaged_records == 3
    assert again.cursor == {"s1 p": 2, "s2 p": 1}


def test_a_damaged_segment_sealed_after_the_cursor_does_not_stop_start_up(tmp_path: Path) -> None:
    spool = open_spool(tmp_path)
    spool.append([line("s1", 1)], {"s1 p": 1})
    spool.seal()
    whole = gzip.compress(line("s1", 2) * 50, mtime=0)
    (tmp_path / "seg-000000000002-50.jsonl.gz").write_bytes(whole[: len(whole) // 2])  # cut by the power cut
    again = open_spool(tmp_path)
    assert [segment.number for segment in again.sealed] == [1, 2]  # the cloud judges it (400: set aside)
    assert again.through == 2 and again.next_number == 3 and again.damaged_segments == 1


DAMAGE = {
    "truncated": lambda whole: whole[: len(whole) // 2],
    "zeros": lambda whole: b"\0" * len(whole),
    "empty": lambda whole: b"",
    "not JSON": lambda whole: b"\xff\xfe garbage",
    "wrong types": lambda whole: json.dumps({"id": 7, "through": "1", "keys": [1]}).encode(),
    "a bool for a number": lambda whole: json.dumps({"id": ["x"], "through": True, "keys": {"s1 p": 2}}).encode(),
    "a batch id's separator in the id": lambda whole: json.dumps({"id": "a-b", "through": -1, "keys": {}}).encode(),
}


def shipped_and_damaged(directory: Path, name: str, damage: str) -> tuple[Spool, bytes]:
    """A spool that sealed two segments (the cloud has the first), then `name` damaged as `damage` says."""
    spool = open_spool(directory)
    for n in (1, 2):
        spool.append([line("s1", n)], {"s1 p": n})
        spool.seal()
    spool.confirmed(spool.sealed[0])
    spool.close()
    damaged = DAMAGE[damage]((directory / name).read_bytes())
    (directory / name).write_bytes(damaged)
    return spool, damaged


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_cursor_is_set_aside_and_the_spool_starts_under_a_new_id(tmp_path: Path, damage: str) -> None:
    """A lost cursor loses nothing: the new id makes the shipper ship all the store holds again, and
    new segments cannot reuse the batch id of one the cloud has (segment 1, confirmed and deleted)."""
    before, damaged = shipped_and_damaged(tmp_path, "cursor.json", damage)
    again = open_spool(tmp_path)
    assert (tmp_path / "cursor.json.damaged").read_bytes() == damaged and again.damaged_files == 1
    assert again.id != before.id and json.loads((tmp_path / "spool.json").read_text()) == {"id": again.id}
    assert [segment.number for segment in again.sealed] == [2]  # still to upload
    again.append([line("s1", 1)], {"s1 p": 1})
    again.seal()
    assert again.batch_id(again.sealed[-1], "g") not in {before.batch_id(segment, "g") for segment in before.sealed}
    assert json.loads((tmp_path / "cursor.json").read_text())["through"] == 3
    assert open_spool(tmp_path).damaged_files == 0  # set aside once, counted once


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_spool_id_is_set_aside_and_a_new_one_made(tmp_path: Path, damage: str) -> None:
    before, damaged = shipped_and_damaged(tmp_path, "spool.json", damage)
    again = open_spool(tmp_path)
    assert (tmp_path / "spool.json.damaged").read_bytes() == damaged and again.damaged_files == 1
    assert again.id != before.id and json.loads((tmp_path / "spool.json").read_text()) == {"id": again.id}
    assert again.cursor == {"s1 p": 2} and again.next_number == 3  # the cursor file was whole


def test_a_file_damaged_again_is_set_aside_beside_the_first_copy(tmp_path: Path) -> None:
    """The first damage is the operator's evidence: a second one no longer overwrites it."""
    _, first = shipped_and_damaged(tmp_path, "spool.json", "zeros")
    open_spool(tmp_path).close()
    (tmp_path / "spool.json").write_bytes(b"{")
    assert open_spool(tmp_path).damaged_files == 1
    assert (tmp_path / "spool.json.damaged").read_bytes() == first
    assert (tmp_path / "spool.json.damaged.1").read_bytes() == b"{"
