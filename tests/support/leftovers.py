"""The guard against processes a test leaves running: the run fails, naming the test and the command;
and `ended`, the `finally` of a helper process.

Why: a gateway started by a test that failed before its `finally` (a `pytest.fail` between the start
and the `try`) stayed up for the rest of the session holding its ports and a core, and later tests
failed for the wrong reason (2026-12-07). Reviews catch some of these; this catches the rest.

How, without a list of names that rots: each test's children of pytest are taken before it (after
every wider-scoped fixture it uses is up, since pytest sets those up first) and after its teardown.
A child born meanwhile and still running afterwards is a suspect: it is either a leak or the process
of a wider-scoped fixture first asked for inside the test (`request.getfixturevalue`), which that
fixture ends at its own teardown. So the verdict waits for the end of the session, after every
fixture's teardown: a suspect still running then was left by nobody's fixture, and is a leak. Those
are killed (they would outlive pytest) and the run's exit status is made a failure. Processes of
session fixtures (a shared Mosquitto, the Spark JVM that pyspark keeps for the life of the
interpreter) were running before every test began, so they are never suspects. multiprocessing's
resource tracker is one of those by design: `tracker` starts it before the first test (it lives as
long as the interpreter, started lazily by the first semaphore or queue of a multiprocessing context;
started inside tools/reeval's test it was the guard's one false alarm of its first full run).

Cost: one read of /proc/self/task/*/children and of each child's stat before and after each test:
0.55-0.73 ms for the pair with 3 children at load ~5 (2026-12-07, `timeit.timeit(leftovers.children,
number=2000)` three times), about 1.6 s over the 2,275 tests of the ~50 min suite; no sleep, no polling.

Blind spot: a grandchild whose parent, a child of pytest, was ended (a process a shell wrapper
started) belongs to init from then on and is not seen; the tests start their commands directly.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from multiprocessing import resource_tracker
from pathlib import Path

import pytest

# (pid, start time in clock ticks since boot): a pid reused by a new process is not the suspect
Child = tuple[int, int]
suspects: dict[Child, str] = {}  # the child -> the test it outlived


def stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state letter, start time) of `pid`, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            text = file.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name, in parentheses, may hold spaces
    return int(fields[1]), fields[0], int(fields[19])


def running(child: Child) -> bool:
    """Whether `child` is still this process's child and not a zombie (ended, not yet reaped)."""
    now = stat(child[0])
    return now is not None and now[0] == os.getpid() and now[1] != "Z" and now[2] == child[1]


def children() -> set[Child]:
    """The running children of this process, forked from any of its threads."""
    found: set[Child] = set()
    for thread in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{thread}/children") as listing:
                pids = listing.read().split()
        except OSError:  # the thread ended while we looked
            continue
        for pid in map(int, pids):
            now = stat(pid)
            if now is not None and now[1] != "Z":
                found.add((pid, now[2]))
    return found


def ended(process: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    """Killed if still running, and reaped: for a `finally` after a helper process (a publisher, a
    tracer) whose own end the test waits for and checks on its way."""
    if process.poll() is None:
        process.kill()
    process.wait()


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


@pytest.fixture(scope="session", autouse=True)
def tracker() -> None:
    """multiprocessing's resource tracker, started now (it does not wait for the process: 0.7-16 ms,
    2026-12-07), so that it is a session process and not the suspect of whichever test first makes a
    semaphore; a second start is a no-op (multiprocessing.resource_tracker.ensure_running)."""
    resource_tracker.ensure_running()


@pytest.fixture(autouse=True)
def no_process_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """Marks the children born during the test that are still running after its teardown."""
    before = children()
    yield
    for child in children() - before:
        suspects.setdefault(child, request.node.nodeid)


@pytest.hookimpl(trylast=True)  # after pytest's own pytest_sessionfinish has torn down every fixture
def pytest_sessionfinish(session: pytest.Session) -> None:
    left = {child: test for child, test in suspects.items() if running(child)}
    if not left:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"{test} left pid {pid} running: {command(pid)}" for (pid, _), test in sorted(left.items())]
    for (pid, _), _test in left.items():
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_sep("=", "processes left running by tests (killed)", red=True)
        for line in lines:
            reporter.write_line(line)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
