"""systemd/install.sh and systemd/uninstall.sh for real, as a new user runs them: the README's first
command in a root shell without sudo, on a Debian without systemd (a container, like this machine).

How, without changing this machine: the scripts run as root in namespaces of their own (unshare:
mount, network, PID) where /etc, /opt, /usr/local, /var and /run are overlays whose writes land in
the test's directory. Everything else is real: the scripts, useradd, pip into /opt/sepa-gateway,
Mosquitto with the installer's listener and logins, the gateway on its installed ports (the
namespace's own loopback, so they collide with nothing). Its network has only loopback: pip
installs from a wheelhouse the test downloads first (PIP_NO_INDEX, PIP_FIND_LINKS).

Protects (issue 18 item 3): as root without sudo the installer runs, and as a user without sudo it
says in one line how to run it; `sepa-gateway` and `sepa-cloud` are on PATH; the gateway is ready
(/health 200: store, clock, MQTT logged in to the installed Mosquitto, CoAP); the examples run
with the installed environment, against the installed gateway; its log is the rotated file; an
upgrade keeps data and configuration; a bad configuration is reported at once with its line and
the running gateway is not restarted; uninstall keeps data and configuration (a new install finds
them), --purge removes them and the service user. And as a user who may use sudo (Debian's sudo
package installed in the namespace only), the installer asks sudo for root and installs the same.
And on a machine that systemd runs (this machine's systemd booted as the namespaces' first
process): the unit enabled and started, the gateway ready under the unit's hardening as its own
user, its log in the journal, started again by systemd when killed, a failed start reported from
the journal, uninstall taking the unit and Mosquitto's drop-in away.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.kernel_clock import kernel_synchronised
from tests.support.leftovers import ended

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ("pyproject.toml", "README.md", "broker", "adapters", "gateway", "cloud", "tools", "ontologies", "examples")
OVERLAID = ("/etc", "/opt", "/usr/local", "/var", "/run")
INSTALL_TIMEOUT_S = 900
# the installed gateway's process, as pgrep -f finds it ([/]: not the shell that runs pgrep)
GATEWAY = "'[/]opt/sepa-gateway/bin/sepa-gateway run'"
# clock_sync is this machine's kernel's account of its clock (not required): the test cannot set it
SYNC = "failing" if kernel_synchronised() is False else "ok"
ALL_OK = {"store": "ok", "engine": "ok", "clock": "ok", "clock_sync": SYNC, "mqtt": "ok", "coap": "ok"}
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # a root shell's PATH on Debian


@dataclass
class Machine:
    """A root shell in the namespaces: `run` a command there."""

    pid: int  # the namespaces' first process, as this machine sees it
    env: dict[str, str]

    def run(self, command: str, timeout: float = 120, user: int | None = None) -> subprocess.CompletedProcess[str]:
        argv = ["nsenter", "-t", str(self.pid), "--mount", "--net", "--pid", "--"]
        if user is not None:
            argv += ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "--"]
        return subprocess.run(
            [*argv, "bash", "-c", command], capture_output=True, text=True, timeout=timeout, env=self.env
        )

    def ok(self, command: str, timeout: float = 120) -> str:
        done = self.run(command, timeout)
        assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def health(self) -> tuple[int, dict[str, object]]:
        """/health's status and body; (0, {}) while nothing listens (a restart)."""
        done = self.run("curl -s -w '\\n%{http_code}' http://127.0.0.1:8000/health")
        if done.returncode == 7:
            return 0, {}
        assert done.returncode == 0, done.stderr
        body, _, status = done.stdout.rpartition("\n")
        return int(status), json.loads(body)


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every wheel the installer's pip needs, for Debian's own python3 (the one the installer uses)."""
    source = tmp_path_factory.mktemp("wheelhouse-source")
    copy_source(source)
    folder = tmp_path_factory.mktemp("wheelhouse")
    done = subprocess.run(
        [
            "/usr/bin/python3",
            "-m",
            "pip",
            "download",
            "-q",
            "-d",
            str(folder),
            str(source),
            "setuptools>=68",
            "wheel",
            "pip",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return folder


def copy_source(target: Path) -> None:
    """The clone as a new user has it (a copy: pip builds in the tree it is given)."""
    target.mkdir(exist_ok=True)
    for name in (*SOURCE, "systemd"):
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, target / name, ignore=shutil.ignore_patterns("__pycache__", "node_modules"))
        else:
            shutil.copy2(ROOT / name, target / name)


# Booted, systemd as the namespaces' first process: the host's /tmp behind a tmpfs (systemd-tmpfiles
# empties /tmp at boot: it emptied this machine's once), the test's own folders bound back into it;
# /sys and /proc/sys read-only (no udev, no sysctl of the host's kernel); no console getty; none of
# this machine's enabled services but the ones the installer enables itself.
MASKED = (
    "console-getty.service",
    "getty@tty1.service",
    "serial-getty@console.service",
    "getty.target",
    "systemd-udevd.service",
    "systemd-udev-trigger.service",
    "systemd-tmpfiles-clean.timer",
)


def _boot_script(tmp_path: Path, wheelhouse: Path) -> list[str]:
    """What readies the namespaces for systemd, after the overlays."""
    kept = Path(os.path.commonpath([tmp_path, wheelhouse]))
    steps = ["mount --bind /tmp /mnt", "mount -t tmpfs tmpfs /tmp"]
    if kept.is_relative_to("/tmp"):
        steps += [f"mkdir -p {kept}", f"mount --bind /mnt/{kept.relative_to('/tmp')} {kept}"]
    steps += [
        "umount -l /mnt",
        "mount -o remount,bind,ro /sys",
        "mount --bind /proc/sys /proc/sys",
        "mount -o remount,bind,ro /proc/sys",
        "rm -f /etc/systemd/system/*.wants/*",
        *(f"ln -sf /dev/null /etc/systemd/system/{unit}" for unit in MASKED),
    ]
    return steps


@contextlib.contextmanager
def namespace(
    tmp_path: Path, wheelhouse: Path, overlaid: tuple[str, ...] = OVERLAID, *, boot: bool = False
) -> Iterator[Machine]:
    """A root shell in namespaces of its own, `overlaid` directories' writes landing in `tmp_path`;
    with `boot`, systemd runs them (PID 1 there), as on a Debian machine that booted."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("nsenter") is None:
        pytest.fail("the install test runs as root with unshare and nsenter (util-linux)", pytrace=False)
    mounts = []
    for directory in overlaid:
        name = directory.strip("/").replace("/", "-")
        upper, work = tmp_path / "overlay" / name / "upper", tmp_path / "overlay" / name / "work"
        upper.mkdir(parents=True)
        work.mkdir()
        mounts.append(f"mount -t overlay overlay -o lowerdir={directory},upperdir={upper},workdir={work} {directory}")
    if boot:
        log = tmp_path / "systemd.log"
        first = f"exec env container=sepa-gateway-test /lib/systemd/systemd --system >{log} 2>&1"
        script = " && ".join([*mounts, *_boot_script(tmp_path, wheelhouse), "ip link set lo up", "echo ready", first])
    else:
        script = " && ".join([*mounts, "ip link set lo up", "echo ready", "exec sleep infinity"])
    holder = subprocess.Popen(
        [
            "unshare",
            "--mount",
            "--net",
            "--pid",
            "--fork",
            "--mount-proc",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n", holder.stderr
        (first,) = subprocess.run(["pgrep", "-P", str(holder.pid)], capture_output=True, text=True).stdout.split()
        env = {"PATH": PATH, "HOME": "/root", "LANG": "C.UTF-8", "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheelhouse)}
        machine = Machine(int(first), env)
        if boot:
            deadline = time.monotonic() + 60
            while (state := machine.run("systemctl is-system-running").stdout.strip()) not in ("running", "degraded"):
                assert time.monotonic() < deadline, f"systemd did not boot: {state}"
                time.sleep(0.5)
        yield machine
    finally:
        # the namespace's first process: every process in it goes. Looked up again here: a failure
        # before `first` was known (no "ready", not one child) left the namespace running
        for child in subprocess.run(["pgrep", "-P", str(holder.pid)], capture_output=True, text=True).stdout.split():
            os.kill(int(child), signal.SIGKILL)
        ended(holder)


@pytest.fixture
def machine(tmp_path: Path, wheelhouse: Path) -> Iterator[Machine]:
    with namespace(tmp_path, wheelhouse) as machine:
        yield machine


@pytest.fixture(scope="module")
def sudo_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Debian's sudo, to install inside a namespace only: this machine keeps none, since the test
    of a root shell without sudo needs a machine without it."""
    folder = tmp_path_factory.mktemp("sudo")

    def download() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["apt-get", "download", "sudo"], cwd=folder, capture_output=True, text=True, timeout=300)

    done = download()
    if done.returncode != 0:  # no package lists (a machine that had all the test packages already)
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, timeout=600)
        done = download()
    assert done.returncode == 0, done.stderr
    (package,) = folder.glob("sudo_*.deb")
    return package


def ready_components(machine: Machine) -> dict[str, str]:
    """Each component's status on the installed gateway's /health once it says ready (200), within 30 s."""
    deadline = time.monotonic() + 30
    while (status := machine.health())[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.5)
    status, body = machine.health()
    assert status == 200, body
    return {name: component["status"] for name, component in body["components"].items()}  # type: ignore[union-attr]


def squat_websocket_port(machine: Machine) -> None:
    """Another program on the gateway's WebSocket port (9000), its pid in /run/squatter, once it
    accepts: asked every 0.1 s, within 60 s (it was a fixed second's sleep, then one connect)."""
    machine.ok("python3 -m http.server 9000 --bind 127.0.0.1 >/dev/null 2>&1 & echo $! > /run/squatter")
    connect = "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 9000), 2)' 2>/dev/null"
    machine.ok(f"until {connect}; do [ $SECONDS -lt 60 ] || exit 1; sleep 0.1; done")


def test_install_upgrade_bad_configuration_uninstall_purge(machine: Machine, tmp_path: Path) -> None:
    clone = tmp_path / "sepa-gateway"
    copy_source(clone)

    # a user who is not root, where there is no sudo (nobody, with a clone it can read)
    machine.ok(f"cp -r {clone} /var/tmp/clone && chmod -R a+rX /var/tmp/clone")
    refused = machine.run("/var/tmp/clone/systemd/install.sh", user=65534)
    assert refused.returncode == 1
    assert refused.stderr == (
        "install.sh: run it as root (e.g. su -c '/var/tmp/clone/systemd/install.sh'): there is no sudo here\n"
    )

    # a CLI run as root before the installer (`sensors add --coap`, umask 000) left the service's
    # state directories root's, 0777: the service could not open its store (attack pass)
    state = "/var/lib/sepa-gateway"
    machine.ok(
        f"umask 000 && mkdir -p {state}/data/coap-sensors && chmod 0700 {state}/data/coap-sensors"
        f" && touch {state}/data/root-made && printf 'ROOT-ONLY\\n' >/var/tmp/victim && chmod 0600 /var/tmp/victim"
        f" && ln -s /var/tmp/victim {state}/data/link"
    )

    out = machine.ok(f"cd {clone} && ./systemd/install.sh", timeout=INSTALL_TIMEOUT_S)
    assert " is running: http://localhost:8000/query" in out, out
    assert "/var/lib/sepa-gateway/sepa-gateway.log" in out
    assert machine.ok(f"find {state} -user root") == ""  # the service's now, modes as its UMask=0027
    owners = machine.ok(f"stat -c '%U:%a' {state}/data {state}/data/coap-sensors {state}/data/root-made")
    assert owners.split() == ["sepa-gateway:750", "sepa-gateway:700", "sepa-gateway:640"]
    assert machine.ok("stat -c '%U:%a' /var/tmp/victim; cat /var/tmp/victim") == "root:600\nROOT-ONLY\n"  # not followed
    machine.ok(f"rm {state}/data/link")  # (a link's mode is 0777: assert_private below would count it)
    # the configuration may hold [mqtt] password: the service's group reads it, other users do not
    assert machine.ok("stat -c '%U:%G:%a' /etc/sepa-gateway/sepa-gateway.toml") == "root:sepa-gateway:640\n"
    assert machine.ok("command -v sepa-gateway sepa-cloud").split() == [
        "/usr/local/bin/sepa-gateway",
        "/usr/local/bin/sepa-cloud",
    ]
    assert machine.ok("sepa-gateway --version").startswith("sepa-gateway ")
    spark = machine.run("sepa-cloud stream --help")
    assert spark.returncode == 2 and "SEPA_GATEWAY_CLOUD=1 ./systemd/install.sh" in spark.stderr

    assert ready_components(machine) == ALL_OK

    # the examples, with the installed environment only (not from the clone), against the installed gateway
    lighting = machine.ok(
        "cd / && /opt/sepa-gateway/bin/python -m examples.smart_lighting.smart_lighting --delay 300 "
        "--url http://127.0.0.1:8000 --ws-url ws://127.0.0.1:9000/subscribe"
    )
    assert lighting.splitlines()[-1].endswith("OFF only Δt after the last presence")
    log = machine.ok("cat /var/lib/sepa-gateway/sepa-gateway.log")
    assert 'msg="sepa-gateway serving"' in log  # the rotated file of `run --log-file`; stderr is apart
    assert "--log-file /var/lib/sepa-gateway/sepa-gateway.log" in machine.ok("pgrep -af 'sepa-gateway run'")
    assert machine.ok("cat /var/lib/sepa-gateway/sepa-gateway.stderr") == ""
    # the unit's malloc (mimalloc: a compaction's free holds the GIL 2.5-4x shorter), workers included
    gateway_pid = machine.ok(f"pgrep -f {GATEWAY}").split()[0]
    assert "libmimalloc" in machine.ok(f"cat /proc/{gateway_pid}/maps")
    assert "libmimalloc" in machine.ok(f"cat /proc/$(pgrep -P {gateway_pid} -f broker.workers.replica | head -1)/maps")

    # Mosquitto's ACL beside its password file, the sensors' grants in it
    assert "acl_file /etc/mosquitto/sepa-gateway.acl" in machine.ok("cat /etc/mosquitto/conf.d/sepa-gateway.conf")
    assert machine.ok("stat -c '%U %a' /etc/mosquitto/sepa-gateway.acl").strip() == "mosquitto 600"
    machine.ok("sepa-gateway sensors add boiler && sepa-gateway sensors allow boiler --topic 'plant/boiler/#'")
    # its open files raised for idle LAN connections; the gateway on its own listener (1884)
    limits = machine.ok("grep 'Max open files' /proc/$(pgrep -x mosquitto)/limits").split()
    hard = int(machine.ok("ulimit -Hn"))  # this container's; a Debian without systemd has 1,048,576 or more
    assert int(limits[3]) >= min(65536, hard), limits  # the soft limit, 1024 before
    lan = (min(65536, hard) - 1024) // 2
    assert f"\nmax_connections {lan}\n" in machine.ok("cat /etc/mosquitto/conf.d/sepa-gateway.conf")
    assert "listener 1884 127.0.0.1" in machine.ok("cat /etc/mosquitto/conf.d/sepa-gateway.conf")
    # as an installation from before that listener: the upgrade below moves the gateway to it
    machine.ok("sed -i '/^\\[mqtt\\]/,/^\\[/ s/^port = 1884 .*/port = 1883/' /etc/sepa-gateway/sepa-gateway.toml")
    assert "\nport = 1883\n" in machine.ok("cat /etc/sepa-gateway/sepa-gateway.toml")

    # an upgrade keeps the data and the configuration
    machine.ok("sepa-gateway update 'INSERT DATA { <urn:kept> <urn:p> 1 }'")
    machine.ok("sed -i 's/^retain_count = 1000 /retain_count = 77 /' /etc/sepa-gateway/sepa-gateway.toml")
    machine.ok("chmod 0644 /etc/sepa-gateway/sepa-gateway.toml && chgrp root /etc/sepa-gateway/sepa-gateway.toml")
    machine.ok(f"cd {clone} && ./systemd/install.sh", timeout=INSTALL_TIMEOUT_S)
    assert "retain_count = 77" in machine.ok("cat /etc/sepa-gateway/sepa-gateway.toml")
    assert machine.ok("stat -c '%U:%G:%a' /etc/sepa-gateway/sepa-gateway.toml") == "root:sepa-gateway:640\n"
    assert "urn:kept" in machine.ok("sepa-gateway query 'SELECT ?s WHERE { ?s <urn:p> 1 }'")
    assert_private(machine)
    assert "user boiler\ntopic write plant/boiler/#" in machine.ok("cat /etc/mosquitto/sepa-gateway.acl")
    assert "\nport = 1884\n" in machine.ok("cat /etc/sepa-gateway/sepa-gateway.toml")
    deadline = time.monotonic() + 30
    while machine.health()[1]["components"]["mqtt"]["status"] != "ok" and time.monotonic() < deadline:  # type: ignore[index]
        time.sleep(0.5)
    assert machine.health()[1]["components"]["mqtt"]["status"] == "ok"  # type: ignore[index]

    # a bad configuration: said at once, with its line; the running gateway is left alone
    pid_before = machine.ok(f"pgrep -f {GATEWAY}")
    machine.ok("sed -i 's/^port = 8000 /port = 80000 /' /etc/sepa-gateway/sepa-gateway.toml")
    line = machine.ok("grep -n '^port = 80000' /etc/sepa-gateway/sepa-gateway.toml").split(":")[0]
    # ...and the code it runs stays the version installed before: the new one was left in /opt, where
    # the query workers the running gateway starts later (and the next boot) ran it on that file
    installed = "/opt/sepa-gateway/lib/python3*/site-packages/gateway/__init__.py"
    with (clone / "gateway" / "__init__.py").open("a") as module:
        module.write("# the newer version\n")
    bad = machine.run(f"cd {clone} && ./systemd/install.sh", timeout=INSTALL_TIMEOUT_S)
    assert bad.returncode == 2
    assert f"sepa-gateway: bad configuration: /etc/sepa-gateway/sepa-gateway.toml:{line}: http.port" in bad.stderr
    assert "the service was not restarted" in bad.stderr and "did not answer" not in bad.stderr
    assert machine.ok(f"pgrep -f {GATEWAY}") == pid_before
    assert "the newer version" not in machine.ok(f"cat {installed}")
    assert "keeps the version installed before" in bad.stderr
    assert machine.run("ls -d /opt/sepa-gateway.*").returncode != 0  # no copy left behind
    machine.ok("sed -i 's/^port = 80000 /port = 8000 /' /etc/sepa-gateway/sepa-gateway.toml")

    # a start that fails (another program took the WebSocket port while the gateway was stopped): its
    # reason, at once
    machine.ok(f"pkill -f {GATEWAY}; while pgrep -f {GATEWAY}; do sleep 0.1; done")
    squat_websocket_port(machine)
    failed = machine.run(f"cd {clone} && ./systemd/install.sh", timeout=INSTALL_TIMEOUT_S)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert (
        "cannot listen on 127.0.0.1:9000" in failed.stderr and "did not start (above: its last words)" in failed.stderr
    )
    machine.ok("kill $(cat /run/squatter)")
    assert "the newer version" in machine.ok(f"cat {installed}")  # a valid file: the new version installed

    # uninstall keeps data and configuration; a new install finds them
    out = machine.ok(f"{clone}/systemd/uninstall.sh")
    assert "kept: /etc/sepa-gateway (configuration), /var/lib/sepa-gateway (data)" in out
    assert machine.run("command -v sepa-gateway || ls /opt/sepa-gateway").returncode != 0
    assert machine.run(f"pgrep -f {GATEWAY}").returncode == 1
    assert machine.run("test -e /etc/mosquitto/conf.d/sepa-gateway.conf").returncode == 1
    machine.ok("test -f /etc/sepa-gateway/sepa-gateway.toml && test -d /var/lib/sepa-gateway/data && id sepa-gateway")
    machine.ok(f"cd {clone} && ./systemd/install.sh", timeout=INSTALL_TIMEOUT_S)
    assert "urn:kept" in machine.ok("sepa-gateway query 'SELECT ?s WHERE { ?s <urn:p> 1 }'")
    assert "retain_count = 77" in machine.ok("cat /etc/sepa-gateway/sepa-gateway.toml")

    # --purge: nothing left of it
    machine.ok(f"{clone}/systemd/uninstall.sh --purge")
    for path in (
        "/opt/sepa-gateway",
        "/etc/sepa-gateway",
        "/var/lib/sepa-gateway",
        "/etc/mosquitto/sepa-gateway.passwd",
    ):
        assert machine.run(f"test -e {path}").returncode == 1, path
    assert machine.run("id sepa-gateway").returncode == 1


def test_install_as_a_user_who_may_use_sudo(tmp_path: Path, wheelhouse: Path, sudo_package: Path) -> None:
    """The README's first command as a sudo user: the installer asks sudo for root and installs as
    root would (the namespace gets Debian's sudo package, /usr overlaid for it)."""
    clone = tmp_path / "sepa-gateway"
    copy_source(clone)
    with namespace(tmp_path, wheelhouse, (*OVERLAID, "/usr")) as machine:
        machine.ok(f"dpkg -i {sudo_package}")
        machine.ok("useradd -M -d /var/tmp/alice -s /bin/bash alice && install -d -o alice /var/tmp/alice")
        # sudo starts root from a clean environment; it keeps pip's settings (the wheelhouse: no network here)
        # (and logs each command line to a file, as it logs them to syslog on a Debian)
        sudoers = (
            'Defaults env_keep += \\"PIP_NO_INDEX PIP_FIND_LINKS\\"\\nDefaults logfile=/var/log/sudo.log\\n'
            "alice ALL=(ALL:ALL) NOPASSWD: ALL\\n"
        )
        machine.ok(f"printf '{sudoers}' > /etc/sudoers.d/alice && chmod 440 /etc/sudoers.d/alice && visudo -c")
        machine.ok(f"cp -r {clone} /var/tmp/clone && chown -R alice /var/tmp/clone")
        alice = int(machine.ok("id -u alice"))
        # alice's shell has a shipper's token (the documented alternative to token_file) and the MQTT
        # TLS listener's certificate: sudo gets the installer's settings, and no value on its command
        # line (`sudo env NAME=VALUE ...` showed the token in `ps` to every local user, and in the log)
        tls = "/var/tmp/alice/mqtt"
        made = machine.run(
            f"openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=board"
            f" -keyout {tls}.key -out {tls}.pem",
            user=alice,
        )
        assert made.returncode == 0, made.stderr
        settings = (
            f"SEPA_GATEWAY_SHIPPER_TOKEN=s3cr3t-token SEPA_GATEWAY_MQTT_TLS_CERT={tls}.pem"
            f" SEPA_GATEWAY_MQTT_TLS_KEY={tls}.key"
        )
        done = machine.run(
            f"cd /var/tmp/clone && {settings} ./systemd/install.sh", timeout=INSTALL_TIMEOUT_S, user=alice
        )
        assert done.returncode == 0, done.stdout + done.stderr
        log = machine.ok("cat /var/log/sudo.log")
        assert "COMMAND=./systemd/install.sh\n" in log, log  # nothing on sudo's command line
        assert "s3cr3t-token" not in log and "SHIPPER" not in log, log  # the installer's settings only
        assert "listener 8883" in machine.ok("cat /etc/mosquitto/conf.d/sepa-gateway.conf")  # the settings came
        assert " is running: http://localhost:8000/query" in done.stdout, done.stdout
        assert machine.ok("command -v sepa-gateway") == "/usr/local/bin/sepa-gateway\n"
        assert machine.ok("stat -c '%U' /opt/sepa-gateway /etc/sepa-gateway/sepa-gateway.toml").split() == [
            "root",
            "root",
        ]
        assert machine.ok(f"pgrep -u sepa-gateway -f {GATEWAY}")  # the service runs as its own user
        assert ready_components(machine) == ALL_OK


def assert_private(machine: Machine) -> None:
    """The service's state (store, spool, client registry, logs) is not readable by other local
    accounts: it was 0644 in a 0755 directory, every graph readable past the gates' rights."""
    assert machine.ok("stat -c %a /var/lib/sepa-gateway").strip() == "750"
    readable = machine.ok("find /var/lib/sepa-gateway -user sepa-gateway -perm /o=rwx")
    assert readable == "", readable  # what the service writes (UMask=0027), should the directory open
    assert machine.run("ls /var/lib/sepa-gateway/data", user=65534).returncode != 0


def test_install_on_a_machine_that_runs_systemd(tmp_path: Path, wheelhouse: Path) -> None:
    """The README's first command where systemd runs the machine (Debian, Raspberry Pi OS): the
    installer's systemd branches, the unit's hardening with the gateway under it, journald."""
    clone = tmp_path / "sepa-gateway"
    copy_source(clone)
    with namespace(tmp_path, wheelhouse, boot=True) as machine:
        out = machine.ok(f"cd {clone} && ./systemd/install.sh", timeout=INSTALL_TIMEOUT_S)
        assert " is running: http://localhost:8000/query" in out, out
        assert "logs: systemctl status sepa-gateway; journalctl -u sepa-gateway" in out
        assert machine.ok("systemctl is-enabled sepa-gateway mosquitto").split() == ["enabled", "enabled"]
        assert "LimitNOFILE=" in machine.ok("cat /etc/systemd/system/mosquitto.service.d/sepa-gateway.conf")
        assert ready_components(machine) == ALL_OK
        main = machine.ok("systemctl show -p MainPID --value sepa-gateway").strip()
        assert machine.ok(f"ps -o user= -p {main}").strip() == "sepa-gateway"
        assert "libmimalloc" in machine.ok(f"cat /proc/{main}/maps")  # the unit's Environment=LD_PRELOAD
        # the log in the journal, no file beside the data
        journal = machine.ok("journalctl -u sepa-gateway --no-pager -o cat")
        assert 'msg="sepa-gateway serving"' in journal, journal
        assert machine.run("test -e /var/lib/sepa-gateway/sepa-gateway.log").returncode == 1

        # killed, systemd starts it again (Restart=on-failure), with its data
        machine.ok("sepa-gateway update 'INSERT DATA { <urn:kept> <urn:p> 1 }'")
        machine.ok(f"kill -9 {main}")
        deadline = time.monotonic() + 30
        while machine.ok("systemctl show -p MainPID --value sepa-gateway").strip() in ("0", main):
            assert time.monotonic() < deadline, "systemd did not restart the gateway"
            time.sleep(0.5)
        assert ready_components(machine) == ALL_OK
        assert "urn:kept" in machine.ok("sepa-gateway query 'SELECT ?s WHERE { ?s <urn:p> 1 }'")
        assert_private(machine)

        # a start that fails: its reason from the journal, at once
        machine.ok("systemctl stop sepa-gateway")
        squat_websocket_port(machine)
        failed = machine.run(f"cd {clone} && ./systemd/install.sh", timeout=INSTALL_TIMEOUT_S)
        assert failed.returncode == 1, failed.stdout + failed.stderr
        assert "cannot listen on 127.0.0.1:9000" in failed.stderr, failed.stderr
        assert "did not start (above: its last words)" in failed.stderr
        # and it stays stopped: systemd restarted a refused start every 2 s, for ever
        restarts = machine.ok("systemctl show -p NRestarts --value sepa-gateway").strip()
        time.sleep(6)
        assert machine.ok("systemctl show -p NRestarts --value sepa-gateway").strip() == restarts
        assert machine.ok("systemctl show -p ActiveState --value sepa-gateway").strip() == "failed"
        machine.ok("kill $(cat /run/squatter)")

        # an upgrade keeps the data; uninstall takes the service and Mosquitto's drop-in away
        machine.ok(f"cd {clone} && ./systemd/install.sh", timeout=INSTALL_TIMEOUT_S)
        assert "urn:kept" in machine.ok("sepa-gateway query 'SELECT ?s WHERE { ?s <urn:p> 1 }'")
        machine.ok(f"{clone}/systemd/uninstall.sh")
        assert machine.run("systemctl cat sepa-gateway").returncode != 0
        assert machine.run(f"pgrep -f {GATEWAY}").returncode == 1
        assert machine.run("test -e /etc/systemd/system/mosquitto.service.d/sepa-gateway.conf").returncode == 1
        assert machine.ok("systemctl is-active mosquitto").strip() == "active"


def test_install_trusts_neither_its_directory_nor_the_service_users_files(machine: Machine, tmp_path: Path) -> None:
    """Attack pass, as root on an installed appliance: a json.py in the directory the installer was
    started from ran as root (`python -c`) and as the service; the service user's symlink in place
    of its certificate made root copy a root-only file 0644 into /etc/sepa-gateway (and the
    fingerprint step then failed with a traceback); an upgrade amended a configuration with a
    syntax error before checking it; and `sensors list | grep -q` under pipefail could reset the
    gateway's MQTT password. Run as an upgrade from before [security], from a hostile directory."""
    clone = tmp_path / "sepa-gateway"
    copy_source(clone)
    hostile = "/var/tmp/hostile"
    (tmp_path / "json.py").write_text(
        "import importlib, os, sys\n"
        f"open('{hostile}/ran', 'a').write(f'uid {{os.getuid()}} {{sys.argv[:2]}}\\n')\n"
        "sys.path = [p for p in sys.path if p not in ('', os.getcwd())]\n"
        "del sys.modules['json']\n"
        "globals().update(importlib.import_module('json').__dict__)\n"
    )
    machine.ok(
        f"install -d -m 0777 {hostile} && install -m 0666 /dev/null {hostile}/ran"
        f" && install -m 0644 {tmp_path}/json.py {hostile}/json.py"
    )
    installed = (ROOT / "systemd" / "sepa-gateway.toml").read_text()
    security_section = slice(installed.index("\n[security]\n") + 1, installed.index("\n[mqtt]\n") + 1)
    before_security = installed[: security_section.start] + installed[security_section.stop :]
    # as every older installer wrote it: each default shown, the plain gates on every address
    plain_host = '\nhost = "127.0.0.1"          # INSTALLED'
    assert plain_host in before_security
    before_security = before_security.replace(plain_host, '\nhost = "0.0.0.0"            # INSTALLED')
    (tmp_path / "old.toml").write_text(before_security + "this line is not TOML\n")
    (tmp_path / "fixed.toml").write_text(before_security)
    config = "/etc/sepa-gateway/sepa-gateway.toml"
    machine.ok(f"install -D -m 0644 {tmp_path}/old.toml {config}")

    bad = machine.run(f"cd {hostile} && {clone}/systemd/install.sh", timeout=INSTALL_TIMEOUT_S)
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert machine.ok(f"cat {config}") == (tmp_path / "old.toml").read_text()  # checked first, not amended

    machine.ok(f"install -m 0644 {tmp_path}/fixed.toml {config}")
    upgraded = machine.run(f"cd {hostile} && {clone}/systemd/install.sh", timeout=INSTALL_TIMEOUT_S)
    assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
    # the plain gates on 127.0.0.1: the upgrade moved the old file's 0.0.0.0, where they stayed,
    # unauthenticated, while the installer said "127.0.0.1 only"
    listening = machine.ok("ss -Hltn").split()
    assert "0.0.0.0:8000" not in listening and "0.0.0.0:9000" not in listening, listening
    assert "127.0.0.1:8000" in listening and "127.0.0.1:9000" in listening, listening
    assert '\nhost = "127.0.0.1"          # set by the upgrade (was "0.0.0.0")' in machine.ok(f"cat {config}")
    assert "the plain gates (no authentication) now listen on 127.0.0.1 only" in upgraded.stderr
    assert "\n[security]\nenabled = true" in machine.ok(f"cat {config}")
    assert machine.ok(f"readlink /proc/$(pgrep -f {GATEWAY})/cwd") == "/\n"
    password = machine.ok("cat /etc/sepa-gateway/mqtt-password")

    # the service user puts a symlink to a root-only file in place of its certificate (the gateway
    # keeps starting: it uses a pair the operator configured)
    security, operator = "/var/lib/sepa-gateway/data/security", "/etc/sepa-gateway/operator"
    (tmp_path / "tls.toml").write_text(f'tls_cert = "{operator}-cert.pem"\ntls_key = "{operator}-key.pem"\n')
    machine.ok(
        f"cp {security}/tls-cert.pem {operator}-cert.pem && cp {security}/tls-key.pem {operator}-key.pem"
        f" && chown sepa-gateway {operator}-*.pem && chmod 0600 {operator}-*.pem && cat {tmp_path}/tls.toml >>{config}"
        " && printf 'ROOT-ONLY\\n' >/var/tmp/victim && chmod 0600 /var/tmp/victim"
        f" && ln -sf /var/tmp/victim {security}/tls-cert.pem"
    )
    copy_before = machine.ok("cat /etc/sepa-gateway/tls-cert.pem")
    # as an earlier installer upgraded the file: [security] added, the plain gates left on 0.0.0.0
    machine.ok(f"sed -i '/^\\[http\\]/,/^\\[/ s/^host = .*/host = \"0.0.0.0\"/' {config}")
    again = machine.run(f"cd {hostile} && {clone}/systemd/install.sh", timeout=INSTALL_TIMEOUT_S)
    assert again.returncode == 0, again.stdout + again.stderr
    listening = machine.ok("ss -Hltn").split()
    assert "0.0.0.0:8000" not in listening and "127.0.0.1:8000" in listening, listening
    assert "the plain gates (no authentication) now listen on 127.0.0.1 only" in again.stderr
    assert "Traceback" not in again.stderr and f"{security}/tls-cert.pem not copied" in again.stderr, again.stderr
    assert machine.ok("cat /etc/sepa-gateway/tls-cert.pem") == copy_before
    assert "ROOT-ONLY" not in copy_before
    assert machine.ok("cat /etc/sepa-gateway/mqtt-password") == password  # the gateway's login kept

    # the installer's health check asks where [http] says: it took the file's first `port =` line,
    # whatever its section, and asked 127.0.0.1 only (then "did not answer" after 30 s, exit 1)
    http = '/^\\[http\\]/,/^\\[/ { s/^host = .*/host = "127.0.0.2"/; s/^port = 8000 /port = 8001 /; }'
    machine.ok(f"sed -i '{http}' {config}")
    moved = machine.run(f"cd {hostile} && {clone}/systemd/install.sh", timeout=INSTALL_TIMEOUT_S)
    assert moved.returncode == 0, moved.stdout + moved.stderr
    assert " is running: http://localhost:8001/query" in moved.stdout, moved.stdout

    # the operator's certificate for Mosquitto's TLS listener names a root-only file (a symlink in a
    # directory another user writes): root's `install` copied it 0644 into /etc/mosquitto/certs
    machine.ok(f"ln -s /var/tmp/victim {hostile}/mqtt.pem && ln -s /var/tmp/victim {hostile}/mqtt.key")
    tls = f"SEPA_GATEWAY_MQTT_TLS_CERT={hostile}/mqtt.pem SEPA_GATEWAY_MQTT_TLS_KEY={hostile}/mqtt.key"
    refused = machine.run(f"cd {hostile} && {tls} {clone}/systemd/install.sh", timeout=INSTALL_TIMEOUT_S)
    assert "ROOT-ONLY" not in machine.run("cat /etc/mosquitto/certs/sepa-gateway.*").stdout
    assert refused.returncode == 1 and f"{hostile}/mqtt.pem not copied: not a PEM certificate" in refused.stderr

    assert machine.ok(f"cat {hostile}/ran") == ""  # the planted json.py never ran, as root or as the service
