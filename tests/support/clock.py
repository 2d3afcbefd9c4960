"""A wall clock a test can step under a real gateway process: libfaketime (Debian's `faketime`).

The process reads its wall clock through libfaketime, which takes the offset from a file a test
rewrites (`+30d`, `-30d`); CLOCK_MONOTONIC and CLOCK_BOOTTIME are left alone, as NTP leaves them
when it steps a Raspberry Pi's clock (it has no real-time clock: it boots at fake-hwclock's last
save or at 1970). The offset file is read again at most once a second (FAKETIME_CACHE_DURATION).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
_CANDIDATES = (LIBFAKETIME, *Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))


@dataclass
class SteppedClock:
    """The offset file and the environment a gateway needs to run on it."""

    offset_file: Path
    library: Path

    def step(self, offset: str) -> None:
        """Set the wall clock's offset from the real time (`+30d`, `-2h`, `+0`)."""
        self.offset_file.write_text(offset + "\n", encoding="ascii")

    @property
    def environment(self) -> dict[str, str]:
        return {
            "LD_PRELOAD": str(self.library),
            "FAKETIME_TIMESTAMP_FILE": str(self.offset_file),
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "FAKETIME_CACHE_DURATION": "1",
        }


@pytest.fixture
def stepped_clock(tmp_path: Path) -> SteppedClock:
    """A clock at the real time to begin with; fails the test where libfaketime is not installed
    (tests/run.sh installs it: a missing part is a failure, never a silent skip)."""
    library = next((path for path in _CANDIDATES if path.exists()), None)
    if library is None:
        pytest.fail("libfaketime is not installed (apt-get install faketime; tests/run.sh installs it)")
    clock = SteppedClock(tmp_path / "faketime", library)
    clock.step("+0")
    return clock
