"""CPU seconds used by a process and its descendants (Linux /proc), to say what a phase cost the
gateway whatever else the machine was doing: its query workers are processes of their own."""

from __future__ import annotations

import os
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int, thread: bool = False) -> tuple[int, float] | None:
    """(parent pid, user + system seconds) of one process, or of its main thread only, None if it
    is gone."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/stat" if thread else f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the name may hold spaces and parentheses
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU seconds of `root` and every live descendant."""
    return sum(_tree(root).values())


def renderer_main_thread_cpu_seconds(root: int) -> float:
    """User + system CPU seconds of the main threads of the Chromium renderers under `root` (the
    chromedriver): a page's JavaScript, style and layout run there, and its long tasks are theirs.
    Why not a task's wall-clock duration: on a loaded machine the thread waits for a core in the
    middle of a task, and the task lasts longer for work the page did not do."""
    total = 0.0
    for pid in _renderers(root):
        stat = _stat(pid, thread=True)
        total += stat[1] if stat is not None else 0.0
    return total


def renderer_main_thread_running(root: int) -> bool:
    """Whether the main thread of a Chromium renderer under `root` is running or waiting for a core
    (state R), not sleeping: in a task. Why not its CPU seconds: at load 14 on 2 cores a thread in
    a task got so little of a core that it looked idle, and a script sent to it waited for the
    task's end, past chromedriver's 30 s."""
    for pid in _renderers(root):
        try:
            text = Path(f"/proc/{pid}/task/{pid}/stat").read_text()
        except OSError:
            continue
        if text[text.rindex(")") + 2] == "R":
            return True
    return False


def _renderers(root: int) -> list[int]:
    """The Chromium renderers among `root` and its live descendants."""
    found = []
    for pid in _tree(root):
        try:
            if b"--type=renderer" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def _tree(root: int) -> dict[int, float]:
    """`root` and its live descendants: the CPU seconds of each."""
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                stats[int(entry.name)] = stat
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    tree, stack = {}, [root]
    while stack:
        pid = stack.pop()
        if pid in stats:
            tree[pid] = stats[pid][1]
        stack.extend(children.get(pid, ()))
    return tree
