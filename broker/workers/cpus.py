"""A worker process runs on every core the machine lets it use.

Why: a process inherits the CPU affinity of the thread that started it, and the gateway may keep
its own threads on one core (gateway/appliance/cores.py); a worker there would take that core's
time from the engine and leave the others idle.
"""

from __future__ import annotations

import contextlib
import os


def use_every_cpu() -> None:
    """Let this process run on every CPU (the kernel keeps it within its cpuset)."""
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
