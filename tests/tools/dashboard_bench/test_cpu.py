"""CPU seconds from /proc: of a process tree, and of its Chromium renderers' main threads only."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tools.dashboard_bench.cpu import renderer_main_thread_cpu_seconds, renderer_main_thread_running, tree_cpu_seconds

# spins its main thread for 0.3 CPU seconds and another for 1.0, says so, and waits for its stdin
SPINNER = """
import sys, threading, time
def spin(seconds):
    while time.thread_time() < seconds:
        pass
other = threading.Thread(target=spin, args=(1.0,))
other.start()
spin(0.3)
other.join()
print("spun", flush=True)
sys.stdin.read()
"""


def test_only_the_renderers_main_threads_are_counted() -> None:
    """A renderer's other threads (compositor, workers) and other processes are not the page's
    main thread; the CPU seconds are the thread's own, whatever the machine's load."""
    renderer = subprocess.Popen(
        [sys.executable, "-c", SPINNER, "--type=renderer"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    other = subprocess.Popen(
        [sys.executable, "-c", SPINNER, "--type=gpu-process"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        for child in (renderer, other):
            assert child.stdout is not None and child.stdout.readline() == "spun\n"
        main = renderer_main_thread_cpu_seconds(os.getpid())
        assert 0.25 <= main < 0.9, (
            main
        )  # (in ticks of 10 ms) the renderer's main thread, not its other one nor the gpu process
        assert tree_cpu_seconds(os.getpid()) >= 2.6  # both processes, both threads each
    finally:
        for child in (renderer, other):
            child.communicate("")


def test_a_renderer_in_a_task_is_running_and_one_waiting_for_work_is_not() -> None:
    """Runnable (state R) counts whether or not the thread has a core: load does not hide a task."""
    waiting = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()", "--type=renderer"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert waiting.stdout is not None and waiting.stdout.readline() == "ready\n"
        assert not renderer_main_thread_running(os.getpid())
        spinning = subprocess.Popen([sys.executable, "-c", "while True: pass", "--type=renderer"])
        try:
            deadline = time.monotonic() + 30  # once it runs Python with the flag, not only forked
            while not renderer_main_thread_running(os.getpid()):
                assert time.monotonic() < deadline, "a spinning renderer's main thread was never seen running"
                time.sleep(0.01)
        finally:
            spinning.kill()
            spinning.wait()
    finally:
        waiting.communicate("")
