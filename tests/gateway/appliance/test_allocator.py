"""glibc malloc arenas: at most ARENA_MAX in the gateway, and in the processes it starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.appliance.allocator import ARENA_MAX, limit_malloc_arenas

ROOT = Path(__file__).resolve().parents[3]

# Threads allocating at the same time, then glibc's own account of its arenas (malloc_info's XML,
# one <heap> element per arena) and the limit the child processes inherit.
_PROBE = r"""
import ctypes, os, sys, tempfile, threading
if sys.argv[1] == "limited":
    from gateway.appliance.allocator import limit_malloc_arenas
    limit_malloc_arenas()
libc = ctypes.CDLL(None)
libc.fdopen.restype = libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
start = threading.Barrier(8)
def churn():
    start.wait()
    for _ in range(20_000):
        pointer = libc.malloc(256)
        libc.free(pointer)
threads = [threading.Thread(target=churn) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
with tempfile.TemporaryFile() as out:
    stream = libc.fdopen(os.dup(out.fileno()), b"w")
    libc.malloc_info(0, ctypes.c_void_p(stream))
    libc.fclose(ctypes.c_void_p(stream))
    out.seek(0)
    arenas = out.read().count(b"<heap nr=")
child = os.popen(sys.executable + " -c 'import os; print(os.environ.get(\"MALLOC_ARENA_MAX\"))'").read().strip()
print(arenas, child)
"""


def _probe(mode: str) -> tuple[int, str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], env=env, capture_output=True, text=True, check=True)
    arenas, child = out.stdout.split()
    return int(arenas), child


def test_the_gateway_and_its_children_keep_to_arena_max_arenas() -> None:
    arenas, child = _probe("limited")
    assert arenas <= ARENA_MAX
    assert child == str(ARENA_MAX)


def test_without_the_limit_the_same_threads_take_more_arenas() -> None:
    """The probe can fail: glibc's default gives concurrent threads arenas of their own."""
    arenas, child = _probe("default")
    assert arenas > ARENA_MAX and child == "None"


def test_an_operators_own_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    limit_malloc_arenas()
    assert os.environ["MALLOC_ARENA_MAX"] == "4"
