"""broker.gates.slow.MessageWatch: what it reads of the frame headers does not depend on how the
bytes are split between reads (a header is read in one slice when whole, gathered otherwise)."""

from __future__ import annotations

import os

from hypothesis import given
from hypothesis import strategies as st

from broker.gates.slow import MessageWatch

# (opcode, fin, payload size): sizes that take each length form (7 bits, 16 bits, 64 bits)
FRAMES = st.lists(
    st.tuples(
        st.sampled_from((0x0, 0x1, 0x2, 0x8, 0x9, 0xA)), st.booleans(), st.sampled_from((0, 1, 125, 126, 300, 70_000))
    ),
    max_size=12,
)


def encode(opcode: int, fin: bool, size: int, masked: bool) -> bytes:
    head = bytes([(0x80 if fin else 0) | opcode])
    mask_bit = 0x80 if masked else 0
    if size < 126:
        head += bytes([mask_bit | size])
    elif size < 65536:
        head += bytes([mask_bit | 126]) + size.to_bytes(2, "big")
    else:
        head += bytes([mask_bit | 127]) + size.to_bytes(8, "big")
    return head + (os.urandom(4) if masked else b"") + b"x" * size


def expected(frames: list[tuple[int, bool, int]]) -> tuple[int, int, bool]:
    """(messages completed, frames that ended no data message, a data message in progress)."""
    completed = other = 0
    in_message = False
    for opcode, fin, _ in frames:
        if opcode in (0x0, 0x1, 0x2):
            in_message = True
            if fin:
                completed += 1
                in_message = False
                continue
        other += 1
    return completed, other, in_message


@given(frames=FRAMES, masked=st.booleans(), cuts=st.lists(st.integers(min_value=0), max_size=20))
def test_the_counts_do_not_depend_on_where_the_reads_split(
    frames: list[tuple[int, bool, int]], masked: bool, cuts: list[int]
) -> None:
    stream = b"".join(encode(opcode, fin, size, masked) for opcode, fin, size in frames)
    points = sorted({cut % (len(stream) + 1) for cut in cuts} | {0, len(stream)})
    watch = MessageWatch()
    for start, end in zip(points, points[1:], strict=False):
        watch.feed(stream[start:end])
    assert (watch.completed, watch.other_frames, watch.in_message) == expected(frames)


def test_a_header_split_at_every_byte_is_read() -> None:
    stream = encode(0x9, True, 0, True) + encode(0x1, False, 126, True) + encode(0x0, True, 70_000, False)
    watch = MessageWatch()
    for index in range(len(stream)):
        watch.feed(stream[index : index + 1])
    assert (watch.completed, watch.other_frames, watch.in_message) == (1, 2, False)
