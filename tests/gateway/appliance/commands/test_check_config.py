"""`sepa-gateway check-config FILE`, what the installer runs before it (re)starts the service.

Protects: a bad file is ONE line on stderr, ``FILE:LINE: problem``, with the line of the offending
setting (a key, a table header, the nth ``[[array]]`` entry, tomllib's own line for broken TOML),
and exit code 2; the annotated systemd/sepa-gateway.toml passes with exit 0; `sepa-gateway run`
names the same line; an error that no line of the file holds is still one line naming the file.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gateway.appliance.cli import main as cli_main
from gateway.appliance.config import MAX_CONFIG_BYTES

REPO = Path(__file__).resolve().parents[4]

HEAD = '[engine]\nmode = "incremental"\n\n[http]\nhost = "127.0.0.1"\n'  # lines 1-5
CASES: dict[str, tuple[str, int, str]] = {  # file text, line, fragment of the message
    "out-of-range": (HEAD + "port = 80000\n", 6, "http.port must be between 0 and 65535"),
    "unknown-key": (HEAD + "prot = 8000\n", 6, "unknown setting http.prot"),
    "wrong-type": (HEAD + 'port = "8000"\n', 6, "http.port must be a int"),
    "invalid-toml": (HEAD + "port = = 1\n", 6, "not valid TOML"),
    "unknown-section": (HEAD + "\n[htp]\nport = 1\n", 7, "unknown section [htp]"),
    "second-of-two": (HEAD + "request_timeout_s = 0.0\n", 6, "http.request_timeout_s must be positive"),
    "allowed-hosts": (
        HEAD + 'port = 8000\nallowed_hosts = ["gw.plant.example", "http://gw.plant.example:8000"]\n',
        7,
        "http.allowed_hosts[1] must be a host name without scheme or port",
    ),
    "invalid-value": ('[engine]\nallow_load = false\nmode = "fast"\n', 3, "engine.mode"),
    "reeval-workers": ("[engine]\nallow_load = false\nreeval_workers = -1\n", 3, "engine.reeval_workers"),
    "array-entry": (
        '[[security.clients]]\nidentity = "a"\nread = ["*"]\n\n[[security.clients]]\nidentity = "b"\n'
        'read = ["not an iri"]\n\n[security]\nenabled = true\n',
        7,
        "security.clients[1].read",
    ),
    "mapping-entry": (
        '[[mqtt.mappings]]\nid = "a"\ntopic = "t/a"\nextract = "number"\nproperty = "temperature"\n'
        'sensor = "urn:a"\n\n[[mqtt.mappings]]\nid = "b"\ntopic = "t/b"\n',
        8,
        "mqtt.mappings[1] (id 'b')",
    ),
    "shipper-url": ('[observations]\nretain_count = 5\n\n[shipper]\nenabled = true\nurl = "x"\n', 6, "shipper.url"),
    "latest-view-bound": (
        "[observations]\nretain_count = 5\nmax_sensor_properties = 300000\n",
        3,
        "observations.max_sensor_properties must be 1 to 200,000",
    ),
    "per-sensor-bound": (
        "[observations]\nmax_sensor_properties = 10\nmax_properties_per_sensor = 11\n",
        3,
        "observations.max_properties_per_sensor",
    ),
    # settings that passed the check and failed at run time (2026-12-05, an attack pass)
    "heartbeat-too-short": ("[websocket]\nheartbeat_s = 1e-9\n", 2, "websocket.heartbeat_s must be at least 1"),
    "message-bytes-past-c-int": (
        "[websocket]\nmax_message_bytes = 9223372036854775807\n",
        2,
        "websocket.max_message_bytes must be at most 2147483647",
    ),
    "segment-age-too-short": (
        '[shipper]\nenabled = true\nurl = "https://cloud.example"\nsegment_max_age_s = 1e-300\n',
        4,
        "shipper.segment_max_age_s must be at least 0.1",
    ),
    "landing-port-0": ('[shipper]\nenabled = true\nurl = "https://cloud.example:0"\n', 3, "shipper.url names port 0"),
    "identity-twice": (
        '[[security.clients]]\nidentity = "a"\nread = ["*"]\n\n[[security.clients]]\nidentity = "a"\n'
        'write = ["*"]\n\n[security]\nenabled = true\n',
        5,
        "identity 'a' is given twice",
    ),
    "token-lifetime-bound": (  # the dashboard's renewal timer fired at once past ~24.8 days
        "[security]\nenabled = true\ntoken_lifetime_s = 2592001\n",
        3,
        "security.token_lifetime_s must be 10 to 2,592,000 (30 days)",
    ),
    "token-lifetime-huge": (
        "[security]\nenabled = true\ntoken_lifetime_s = 100000000000000000000\n",
        3,
        "security.token_lifetime_s must be 10 to 2,592,000",
    ),
    "token-lifetime-float": (
        "[security]\nenabled = true\ntoken_lifetime_s = 1e20\n",
        3,
        "security.token_lifetime_s must be a int",
    ),
    "auth-failure-burst-0": (  # 0 would refuse every attempt from the network
        "[security]\nenabled = true\nauth_failure_burst = 0\n",
        3,
        "security.auth_failure_burst must be 1 to 10,000, not 0",
    ),
    "auth-failures-per-s-0": (  # never given back: an address locked out until the gateway restarts
        "[security]\nenabled = true\nauth_failures_per_s = 0.0\n",
        3,
        "security.auth_failures_per_s must be 0.01 to 10,000, not 0.0",
    ),
    "auth-timeout-0": (  # every secure WebSocket closed before its client could send its first subscribe
        "[security]\nenabled = true\nauth_timeout_s = 0.0\n",
        3,
        "security.auth_timeout_s must be 1 to 3,600, not 0.0",
    ),
    # an empty host bound the unauthenticated plain gates on every address, [security] on too; the
    # others passed and `run` died with "Name or service not known" (2026-12-06, an attack pass)
    "http-host-empty": (
        '[http]\nhost = ""\n\n[security]\nenabled = true\n',
        2,
        "http.host must be an IP address or a host name without scheme, port or spaces",
    ),
    "http-host-with-port": ('[http]\nport = 8000\nhost = "127.0.0.1:8000"\n', 3, "http.host must be an IP address"),
    "http-host-url": ('[http]\nhost = "http://127.0.0.1"\n', 2, "http.host must be an IP address"),
    "http-host-space": ('[http]\nhost = " 127.0.0.1"\n', 2, "not ' 127.0.0.1'"),
    "security-host-empty": ('[security]\nenabled = true\nhost = ""\n', 3, "security.host must be an IP address"),
    # passed, and `run` died at the MQTT start with a 45-line traceback (an attack pass)
    "mqtt-tls-ca-missing": ('[mqtt]\ntls = true\ntls_ca = "/nonexistent/ca.pem"\n', 3, "mqtt.tls_ca: no such file"),
    "mqtt-tls-key-missing": (
        '[mqtt]\ntls = true\ntls_cert = "/etc/hostname"\ntls_key = "/nonexistent/key.pem"\n',
        4,
        "mqtt.tls_key: no such file /nonexistent/key.pem",
    ),
    # sections turned off were not checked beyond their keys' names and types: these passed, and
    # failed the day the section was turned on (2026-12-06)
    "coap-off": ("[coap]\nenabled = false\nport = 99999\n", 3, "coap.port must be between 0 and 65535"),
    "mqtt-off": ("[mqtt]\nenabled = false\nport = 0\n", 3, "mqtt: port must be 1..65535, not 0"),
    "shipper-off": ("[shipper]\nenabled = false\nuploads_in_flight = 99\n", 3, "shipper.uploads_in_flight"),
    "shipper-off-url": ('[shipper]\nurl = "ftp://cloud.example"\n', 2, "shipper.url must be an https:// URL"),
    "security-off": ("[security]\nenabled = false\ntoken_lifetime_s = 1\n", 3, "security.token_lifetime_s"),
    "security-off-client": ('[[security.clients]]\nidentity = "a"\nread = ["not an iri"]\n', 3, "clients[0].read"),
    # a message naming two settings pointed at the first one's line whichever was wrong (2026-12-06)
    "second-of-two-named": (
        HEAD + "idle_timeout_s = 5.0\nrequest_timeout_s = 0.0\n",
        7,
        "http.request_timeout_s must be positive, not 0.0",
    ),
    "shipper-backoff-initial": (
        "[shipper]\nsegment_max_age_s = 5.0\nbackoff_initial_s = 0.0\n",
        3,
        "shipper.backoff_initial_s must be positive",
    ),
    "shipper-spool-budget": (
        "[shipper]\nsegment_max_bytes = 2048\nspool_budget_bytes = 10\n",
        3,
        "shipper.spool_budget_bytes must be >= 4 segments",
    ),
    "per-address-connections": (
        "[http]\nmax_connections = 10\nmax_connections_per_address = 0\n",
        3,
        "http.max_connections_per_address must be 1-1000000, not 0",
    ),
    "retain-age": ("[observations]\nretain_count = 4\nretain_age_s = 0.0\n", 3, "observations.retain_age_s must be"),
    "log-backups": ("[logging]\nfile_max_bytes = 5000\nfile_backups = 0\n", 3, "logging.file_backups must be at"),
    "section-level": (  # no token: the [shipper] table is what to fix
        '[shipper]\nenabled = true\nurl = "https://cloud.example"\nspool_dir = "/tmp"\n',
        1,
        "shipper: no bearer token",
    ),
}


def check(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli_main(["check-config", str(path)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_file_is_one_line_with_the_offending_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    monkeypatch.delenv("SEPA_GATEWAY_SHIPPER_TOKEN", raising=False)
    text, line, fragment = CASES[case]
    path = tmp_path / f"{case}.toml"
    path.write_text(text)
    code, out, err = check(path, capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"sepa-gateway: bad configuration: {path}:{line}: "), err
    assert fragment in err
    assert text.splitlines()[line - 1].strip()  # the line named is one of the file's own, not a blank


def test_the_installed_file_passes_and_run_names_the_same_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    installed = REPO / "systemd" / "sepa-gateway.toml"
    assert check(installed, capsys) == (0, f"{installed}: ok\n", "")
    path = tmp_path / "bad.toml"
    path.write_text(CASES["out-of-range"][0])
    assert cli_main(["run", "--config", str(path), "--no-mqtt", "--no-coap"]) == 2
    assert f"{path}:6: http.port must be between" in capsys.readouterr().err


def test_sections_turned_off_need_nothing_of_the_machine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sections turned off are checked value by value, not for what only a running section needs:
    its files (certificates, CA bundles), the shipper's URL and bearer token."""
    monkeypatch.delenv("SEPA_GATEWAY_SHIPPER_TOKEN", raising=False)
    path = tmp_path / "off.toml"
    path.write_text(
        '[mqtt]\nenabled = false\ntls = true\ntls_ca = "/nonexistent/ca.pem"\n\n[coap]\nenabled = false\n\n'
        '[shipper]\nenabled = false\nca_file = "/nonexistent/ca.pem"\n\n'
        '[security]\nenabled = false\ntls_cert = "/nonexistent/cert.pem"\ntls_key = "/nonexistent/key.pem"\n'
    )
    assert check(path, capsys) == (0, f"{path}: ok\n", "")


def test_what_no_line_holds_still_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.toml"
    code, _, err = check(missing, capsys)
    assert (
        code == 2
        and err == f"sepa-gateway: bad configuration: {missing}: cannot read {missing}: No such file or directory\n"
    )


# Found by an attack pass: a traceback (deep nesting), an OOM kill (/dev/zero, a huge file), a
# message without its line (not UTF-8), and files called good that the gateway then could not run
# (nan or inf: every query a 500; two gates on one port: "address already in use" at start).
BAD_FILES: dict[str, tuple[bytes, int | None, str]] = {  # file bytes, line (None: none), fragment
    "deep-array": (b"a = " + b"[" * 900 + b"]" * 900 + b"\n", None, "nested too deeply"),
    "deep-inline-table": (b"a = " + b"{b=" * 900 + b"1" + b"}" * 900 + b"\n", None, "nested too deeply"),
    "too-large": (b"#" * (MAX_CONFIG_BYTES + 1), None, f"larger than {MAX_CONFIG_BYTES} bytes"),
    "latin-1": (b"[http]\nport = 8000 # caf\xe9\n", 2, "not UTF-8 (byte 0xe9 at column 18)"),
    "nan": (b"[engine]\nmode = 'sequential'\ntime_limit_s = nan\n", 3, "engine.time_limit_s must be a finite number"),
    "inf": (b"[http]\nidle_timeout_s = inf\n", 2, "http.idle_timeout_s must be a finite number, not inf"),
    "plug-in-inf": (b"[coap]\nobserve_margin_s = -inf\n", 2, "coap.observe_margin_s must be a finite number"),
    "time-limit-past-a-day": (b"[engine]\ntime_limit_s = 3e6\n", 2, "engine.time_limit_s must be positive and at most"),
    "https-on-the-http-port": (
        b"[security]\nenabled = true\nhttps_port = 8000\n",
        3,
        "security.https_port must differ from http.port (8000)",
    ),
    "wss-on-a-wildcard-over-http": (
        b'[http]\nhost = "127.0.0.1"\n[security]\nenabled = true\nwss_port = 8000\n',
        5,
        "security.wss_port must differ from http.port (8000)",
    ),
    "websocket-on-the-http-port": (b"[websocket]\nport = 8000\n", 2, "websocket.port must differ from http.port"),
    # tracebacks, or a message that did not say what was wrong (2026-12-06, an attack pass)
    "byte-order-mark": (b"\xef\xbb\xbf[http]\nport = 8000\n", 1, "starts with a byte order mark (BOM)"),
    "nul-in-token-file": (
        b'[shipper]\nenabled = true\nurl = "https://cloud.example.org"\ntoken_file = "/tmp/x\\u0000y"\n',
        4,
        "shipper.token_file: cannot read '/tmp/x\\x00y'",
    ),
    "ca-file-past-name-max": (
        b'[shipper]\nenabled = true\nurl = "https://cloud.example.org"\nca_file = "' + b"a" * 300 + b'"\n',
        4,
        "shipper.ca_file: no such file",
    ),
    "tls-cert-past-name-max": (
        b'[security]\nenabled = true\ntls_cert = "' + b"a" * 300 + b'"\ntls_key = "/etc/hostname"\n',
        3,
        "security.tls_cert: no such file",
    ),
    "mqtt-profiles-list": (b"[mqtt]\nprofiles = [[]]\n", 2, "mqtt.profiles must be a list of profile names"),
    "mqtt-profiles-table": (b"[mqtt]\nprofiles = [{a=1}]\n", 2, "mqtt.profiles must be a list of profile names"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_an_attacked_file_is_one_line_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    content, line, fragment = BAD_FILES[case]
    path = tmp_path / f"{case}.toml"
    path.write_bytes(content)
    code, out, err = check(path, capsys)
    where = f"{path}:{line}: " if line is not None else f"{path}: "
    assert (code, out) == (2, "") and err.count("\n") == 1, err
    assert err.startswith(f"sepa-gateway: bad configuration: {where}") and fragment in err, err


@pytest.mark.parametrize("value", ["73915526", '["hunter2-secret"]', "{ a = 73915526 }"])
def test_a_secret_of_the_wrong_type_is_not_echoed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """`password = 73915526` (unquoted) was echoed: "mqtt.password must be a str, not int (73915526)"."""
    path = tmp_path / "gateway.toml"
    path.write_text(f'[mqtt]\nusername = "gw"\npassword = {value}\n')
    code, _, err = check(path, capsys)
    assert code == 2 and f"{path}:3: mqtt.password must be a str, not " in err and "(a secret, not shown)" in err
    assert "73915526" not in err and "hunter2" not in err


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path, gateway_command: list[str]) -> None:
    """open() of a FIFO waits for a writer: `check-config` blocked forever before its file-type check."""
    fifo = tmp_path / "gateway.toml"
    os.mkfifo(fifo)
    try:
        done = subprocess.run([*gateway_command, "check-config", str(fifo)], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("check-config waited for a writer of the FIFO")
    assert (done.returncode, done.stderr) == (
        2,
        f"sepa-gateway: bad configuration: {fifo}: cannot read {fifo}: not a regular file\n",
    )


def test_a_device_is_refused_without_reading_it(capsys: pytest.CaptureFixture[str]) -> None:
    """`check-config /dev/zero` read the endless file whole: 21 GB, then killed by the OOM killer."""
    code, out, err = check(Path("/dev/zero"), capsys)
    assert (code, out, err) == (
        2,
        "",
        "sepa-gateway: bad configuration: /dev/zero: cannot read /dev/zero: not a regular file\n",
    )


@pytest.mark.parametrize("host", ["localhost", "gateway.plant.example", "::1", "0.0.0.0", "192.168.1.20"])
def test_an_address_or_a_host_name_passes_as_a_listening_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], host: str
) -> None:
    path = tmp_path / "host.toml"
    path.write_text(f'[http]\nhost = "{host}"\n[coap]\nhost = "::"\n')  # CoAP follows addresses only
    assert check(path, capsys) == (0, f"{path}: ok\n", "")


def test_run_refuses_an_empty_host_option(gateway_command: list[str]) -> None:
    """`run --host ""` is the file's `host = ""`: every address, refused before any socket is opened."""
    argv = [*gateway_command, "run", "--host", "", "--http-port", "0", "--ws-port", "0", "--no-mqtt", "--no-coap"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail('`run --host ""` served instead of refusing the address')
    assert done.returncode == 2
    assert "bad configuration: http.host must be an IP address or a host name" in done.stderr


def test_gates_on_one_port_but_apart_in_address_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two addresses of this board, or the IPv4 and the IPv6 wildcard, can share a port; so can port 0."""
    path = tmp_path / "apart.toml"
    path.write_text(
        '[http]\nhost = "127.0.0.1"\nport = 8443\n[websocket]\nport = 0\n'
        '[security]\nenabled = true\nhost = "127.0.0.2"\nwss_port = 0\n'
    )
    assert check(path, capsys) == (0, f"{path}: ok\n", "")
    path.write_text('[http]\nhost = "::"\n[security]\nenabled = true\nhost = "0.0.0.0"\nhttps_port = 8000\n')
    assert check(path, capsys) == (0, f"{path}: ok\n", "")


def test_check_config_as_the_installer_runs_it(tmp_path: Path, gateway_command: list[str]) -> None:
    path = tmp_path / "sepa-gateway.toml"
    path.write_text(CASES["unknown-key"][0])
    done = subprocess.run([*gateway_command, "check-config", str(path)], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (2, "")
    assert (
        done.stderr
        == f"sepa-gateway: bad configuration: {path}:6: unknown setting http.prot "
        + (done.stderr.split("unknown setting http.prot ", 1)[1])
    )
    path.write_text(HEAD)
    done = subprocess.run([*gateway_command, "check-config", str(path)], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{path}: ok\n", "")
