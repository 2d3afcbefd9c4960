#!/usr/bin/env bash
# Installs sepa-gateway on Debian / Raspberry Pi OS as a systemd service and starts it on its
# embedded defaults (the installed /etc/sepa-gateway/sepa-gateway.toml lists every default; the
# service keeps its store in /var/lib/sepa-gateway/data). Safe to run again to upgrade: the
# configuration and the data are kept. systemd/uninstall.sh removes it.
# Run it as root, or as a user who may use sudo (it asks sudo for root then): ./systemd/install.sh
# SEPA_GATEWAY_CLOUD=1 also installs the cloud jobs' pyspark and a Java runtime (sepa-cloud stream/stats).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        # sudo starts from a clean environment: keep the installer's own settings, by name only. Their
        # values on sudo's command line (`sudo env NAME=VALUE`) were in `ps` for every local user while
        # it ran and in sudo's log, with every other SEPA_GATEWAY_* (a shipper's token: attack pass)
        keep=()
        for name in SEPA_GATEWAY_CLOUD SEPA_GATEWAY_MQTT_TLS_CERT SEPA_GATEWAY_MQTT_TLS_KEY; do
            [ -z "${!name+set}" ] || keep+=("--preserve-env=$name")
        done
        exec sudo "${keep[@]}" -- "$0" "$@"
    fi
    echo "install.sh: run it as root (e.g. su -c '$0'): there is no sudo here" >&2
    exit 1
fi
# Nothing from the directory it was started in: `python -c` and `-m` put the current directory on
# sys.path, and a json.py there ran as root and, in the gateway started below without systemd
# (which keeps this directory), as the service (attack pass). Every path below is absolute.
cd /

prefix=/opt/sepa-gateway
etc=/etc/sepa-gateway
state=/var/lib/sepa-gateway

missing=()
packages=(python3 python3-venv python3-pip mosquitto libmimalloc2.0)  # the service's malloc (see its unit)
[ "${SEPA_GATEWAY_CLOUD:-}" != 1 ] || packages+=(default-jre-headless)  # Spark 4 runs on Java 17+
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

id -u sepa-gateway >/dev/null 2>&1 || useradd --system --home-dir "$state" --shell /usr/sbin/nologin sepa-gateway

# Debian's own interpreter: the service user must be able to run it (not a per-user Python).
"$prefix/bin/python" -I -c 'import sys; assert sys.base_prefix == "/usr"' 2>/dev/null || { rm -rf "$prefix"; /usr/bin/python3 -I -m venv "$prefix"; }
# The version installed now, kept until the new one accepts the configuration (below): the service
# is not restarted on a file the new code rejects, but the query workers it starts later, and the
# next boot, ran the new code from here on that file (attack pass).
previous="$prefix.previous"
rm -rf "$previous" "$prefix.rejected"  # left by an interrupted run
# Hard links, not a copy: pip unlinks each file before it writes it and moves away what it
# uninstalls, so the links keep the version before as it was. A copy (cp -a) wrote the environment
# again (102 MB, 3,923 entries): with its removal 4.4 s of an upgrade's 24.7 s (a timestamped
# `set -x` of this script in tests/systemd/test_install.py's namespace, load 1.5); 6.1-11.0 s against
# 0.7-1.3 s for the links, their removal 0.7-1.5 s against 0.3-0.7 s (3 alternated runs, load 5,
# 2026-12-07). The previous version is put back if the new one rejects the configuration (below).
[ ! -x "$prefix/bin/sepa-gateway" ] || cp -al "$prefix" "$previous"
"$prefix/bin/pip" install -q --upgrade pip
# the examples are in the package too: $prefix/bin/python -m examples.chat.chat runs without the clone
"$prefix/bin/pip" install -q "$src$([ "${SEPA_GATEWAY_CLOUD:-}" != 1 ] || echo '[cloud]')"
install -m 0644 "$src/README.md" "$prefix/README.md"
install -d -m 0755 /usr/local/bin
for command in sepa-gateway sepa-cloud; do
    ln -sf "$prefix/bin/$command" "/usr/local/bin/$command"  # the operator's CLI (clients, query, check-config...) on PATH
done
install -d -m 0755 "$etc"
# readable by the service, not by every local user: [mqtt] password may be written in it (it was 0644)
[ -f "$etc/sepa-gateway.toml" ] || install -m 0640 -g sepa-gateway "$src/systemd/sepa-gateway.toml" "$etc/sepa-gateway.toml"
chgrp sepa-gateway "$etc/sepa-gateway.toml" && chmod g+r,g-w,o= "$etc/sepa-gateway.toml"
install -d -o sepa-gateway -g sepa-gateway -m 0750 "$state"
# What a CLI run as root left in it before the service made it (`sensors add --coap` made data/
# root's, 0777 under umask 000: the service could not open its store, and installing again did not
# help): the service's, by descriptors, never through the service user's symlinks.
given=$("$prefix/bin/python" -I -c 'import pwd, sys
from broker.api import give_root_entries
user = pwd.getpwnam("sepa-gateway")
print(give_root_entries(sys.argv[1], (user.pw_uid, user.pw_gid)))' "$state")
[ "$given" = 0 ] || echo "install.sh: $given entries that root made in $state (a CLI run as root before the service) are now sepa-gateway's" >&2
# A bad configuration is said now, with its line, by the code just installed: the service is not
# restarted on it, and the version installed before is put back (an upgrade leaves the running
# gateway as it is until the file is fixed). Checked before the upgrade amends it below: the
# operator's file is left as it was until it is valid.
if ! "$prefix/bin/sepa-gateway" check-config "$etc/sepa-gateway.toml" >/dev/null; then
    if [ -d "$previous" ]; then
        mv "$prefix" "$prefix.rejected" && mv "$previous" "$prefix" && rm -rf "$prefix.rejected"
        kept=", and keeps the version installed before"
    fi
    echo "install.sh: fix $etc/sepa-gateway.toml as said above, then run the installer again (the service was not restarted${kept:-})" >&2
    exit 2
fi
rm -rf "$previous"
security_added=""
if ! grep -q '^\[security\]' "$etc/sepa-gateway.toml"; then
    # an installation from before the secure gates: an upgrade turns them on (secure by default)
    printf '\n[security]\nenabled = true              # added by the upgrade: HTTPS + WSS, OAuth 2.0, JWT\n' >>"$etc/sepa-gateway.toml"
    echo "upgrade: [security] enabled in $etc/sepa-gateway.toml (HTTPS on 8443, WSS on 9443)" >&2
    security_added=1
fi
if grep -q '^enabled = true *# added by the upgrade' "$etc/sepa-gateway.toml"; then
    # and the plain gates, which have no authentication, to this board: every older installer wrote
    # [http] host = "0.0.0.0" (its file showed each default), which kept them on every address
    # while this said "127.0.0.1 only" (attack pass); so also in a file an earlier installer
    # upgraded (the line above says so). An address the operator chose stays, said.
    before=$(cksum <"$etc/sepa-gateway.toml")
    sed -i "/^\[http\]/,/^\[/ s/^host *= *\(\"\(0\.0\.0\.0\|::\|\)\"\|'\(0\.0\.0\.0\|::\|\)'\).*$/host = \"127.0.0.1\"          # set by the upgrade (was \1): the plain gates have no authentication/" "$etc/sepa-gateway.toml"
    if [ -n "$security_added" ] || [ "$(cksum <"$etc/sepa-gateway.toml")" != "$before" ]; then
        plain_host=$("$prefix/bin/python" -I -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb")).get("http", {}).get("host", "127.0.0.1"))' "$etc/sepa-gateway.toml")
        case "$plain_host" in
            127.* | ::1 | localhost) echo "upgrade: the plain gates (no authentication) now listen on $plain_host only" >&2 ;;
            *) echo "upgrade: WARNING: the plain gates have no authentication and still listen on $plain_host ([http] host in $etc/sepa-gateway.toml): anyone who reaches them reads and writes the whole store; set host = \"127.0.0.1\" unless that is what you want" >&2 ;;
        esac
    fi
fi
if ! grep -q '^password_file' "$etc/sepa-gateway.toml"; then
    # from before the LAN listener: the gateway now logs in to Mosquitto like every sensor
    sed -i 's|^username = ""\(.*\)$|username = "sepa-gateway"\1\npassword_file = "/etc/sepa-gateway/mqtt-password"|' "$etc/sepa-gateway.toml"
fi

# The local MQTT broker the [mqtt] section talks to: a LAN listener that requires a login (sensors
# get theirs from `sepa-gateway sensors add NAME`), the gateway logging in with its own. Its
# persistent sessions hold the readings sent while the gateway restarts.
passwords=/etc/mosquitto/sepa-gateway.passwd
# The operator's certificate or key for Mosquitto, read once and copied only if it is one: root's
# `install` copied whatever the path named (a root-only file, through a symlink, 0644 for the
# certificate: attack pass). A symlink is followed (Let's Encrypt's live/ names are symlinks), a
# FIFO is not read, and a certificate file with a private key in it is refused (it becomes 0644).
read_pem='import os, stat, sys
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.serialization import load_pem_private_key
kind, path = sys.argv[1:]
try:
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise ValueError("not a regular file")
        pem = file.read(1 << 20)
    if kind == "key":
        load_pem_private_key(pem, None)
    elif b"PRIVATE KEY" in pem or not x509.load_pem_x509_certificates(pem):
        raise ValueError("a private key is in it")
except (OSError, ValueError, TypeError, UnsupportedAlgorithm) as error:
    sys.exit(f"install.sh: {path} not copied: not a PEM {kind} Mosquitto can use ({error})")
sys.stdout.buffer.write(pem)'
copy_pem() {  # KIND SOURCE TARGET MODE
    (umask 077; "$prefix/bin/python" -I -c "$read_pem" "$1" "$2" >"$3.new") || { rm -f "$3.new"; exit 1; }
    chown mosquitto:mosquitto "$3.new"
    chmod "$4" "$3.new"
    mv -f "$3.new" "$3"
}
install -d -m 0755 /etc/mosquitto/conf.d
tls=()
certs=/etc/mosquitto/certs
if [ -n "${SEPA_GATEWAY_MQTT_TLS_CERT:-}" ] && [ -n "${SEPA_GATEWAY_MQTT_TLS_KEY:-}" ]; then
    # the optional TLS listener (8883): the operator's certificate and key, readable by mosquitto only
    install -d -m 0755 "$certs"
    copy_pem certificate "$SEPA_GATEWAY_MQTT_TLS_CERT" "$certs/sepa-gateway.pem" 0644
    copy_pem key "$SEPA_GATEWAY_MQTT_TLS_KEY" "$certs/sepa-gateway.key" 0600
    tls=(8883 "$certs/sepa-gateway.pem" "$certs/sepa-gateway.key")
elif grep -q '^listener 8883' /etc/mosquitto/conf.d/sepa-gateway.conf 2>/dev/null; then
    tls=(8883 "$certs/sepa-gateway.pem" "$certs/sepa-gateway.key")  # turned on by an earlier run: an upgrade keeps it
fi
# Mosquitto's open files: 65536 instead of Debian's 1024 (without systemd, at most the hard limit
# this shell has); each LAN listener may take half of them less 1024, the rest is the gateway's
mosquitto_files=65536
if [ ! -d /run/systemd/system ] && [ "$(ulimit -Hn)" != unlimited ] && [ "$(ulimit -Hn)" -lt "$mosquitto_files" ]; then
    mosquitto_files=$(ulimit -Hn)
fi
LAN_CONNECTIONS=$(( (mosquitto_files - 1024) / 2 )) \
    "$src/systemd/mosquitto-conf.sh" "$passwords" 1883 "1884 127.0.0.1" "${tls[@]}" >/etc/mosquitto/conf.d/sepa-gateway.conf
if awk '/^\[mqtt\]/{m=1; next} /^\[/{m=0} m && /^host = "localhost"/{f=1} END{exit !f}' "$etc/sepa-gateway.toml"; then
    # from before the gateway's own listener: it logs in on 1884, which hosts on the LAN cannot fill
    sed -i '/^\[mqtt\]/,/^\[/ s/^port = 1883\( \|$\)/port = 1884\1/' "$etc/sepa-gateway.toml"
fi
[ -f "$passwords" ] || install -m 0600 -o mosquitto -g mosquitto /dev/null "$passwords"
# the logins first, then grep: in a pipe, grep -q leaving at its match broke the writer's pipe, and
# under pipefail that failure reset the gateway's own password
mqtt_logins=$("$prefix/bin/sepa-gateway" sensors --password-file "$passwords" list)
if [ ! -s "$etc/mqtt-password" ] || ! grep -qx sepa-gateway <<<"$mqtt_logins"; then
    login=$("$prefix/bin/sepa-gateway" sensors --password-file "$passwords" --no-reload add sepa-gateway --reset)
    (umask 027; printf '%s\n' "$(printf '%s\n' "$login" | sed -n 's/^password: //p')" >"$etc/mqtt-password")
    chown root:sepa-gateway "$etc/mqtt-password"
    chmod 0640 "$etc/mqtt-password"
fi
# the ACL beside it (each sensor login publishes its own device's topics only): written again from
# the logins at every install, so that an upgrade from before it gets one and keeps the grants
"$prefix/bin/sepa-gateway" sensors --password-file "$passwords" --no-reload acl >/dev/null
chown mosquitto:mosquitto "$passwords" /etc/mosquitto/sepa-gateway.acl
chmod 0600 "$passwords" /etc/mosquitto/sepa-gateway.acl
if [ -d /run/systemd/system ]; then
    install -d -m 0755 /etc/systemd/system/mosquitto.service.d
    printf '# Written by sepa-gateway install.sh\n[Service]\nLimitNOFILE=%s\n' "$mosquitto_files" \
        >/etc/systemd/system/mosquitto.service.d/sepa-gateway.conf
    systemctl daemon-reload
    systemctl enable mosquitto >/dev/null 2>&1 || true
    systemctl restart mosquitto
else
    # no systemd (a container): (re)start it in the background, with the directories systemd would make
    # until the one running is gone (it holds the ports), not a fixed second
    if pkill -f "mosquitto -d -c /etc/mosquitto/mosquitto.conf" 2>/dev/null; then
        for _ in $(seq 1 100); do pgrep -f "mosquitto -d -c /etc/mosquitto/mosquitto.conf" >/dev/null || break; sleep 0.1; done
    fi
    install -d -o mosquitto -g mosquitto /run/mosquitto /var/log/mosquitto /var/lib/mosquitto
    (ulimit -n "$mosquitto_files"; mosquitto -d -c /etc/mosquitto/mosquitto.conf)
fi


pid=""
if [ -d /run/systemd/system ]; then
    install -m 0644 "$src/systemd/sepa-gateway.service" /etc/systemd/system/sepa-gateway.service
    systemctl daemon-reload
    systemctl enable sepa-gateway >/dev/null
    systemctl restart sepa-gateway
    started="systemctl status sepa-gateway; journalctl -u sepa-gateway"
else
    # No systemd (a container): run the same command line in the background instead, its log in a
    # rotated file ([logging] file_max_bytes, file_backups); stderr keeps what comes before logging
    # (a refused start) and crashes.
    if pkill -f "$prefix/bin/sepa-gateway run"; then
        for _ in $(seq 1 120); do pgrep -f "$prefix/bin/sepa-gateway run" >/dev/null || break; sleep 0.1; done
    fi
    command=$(sed -n 's/^ExecStart=//p' "$src/systemd/sepa-gateway.service")
    environment=$(sed -n 's/^Environment=//p' "$src/systemd/sepa-gateway.service" | tr '\n' ' ')
    pid=$(su -s /bin/sh sepa-gateway -c "umask 027; nohup env $environment $command --log-file $state/sepa-gateway.log >>$state/sepa-gateway.stderr 2>&1 & echo \$!")
    started="$state/sepa-gateway.log (no systemd here: started in the background, pid $pid)"
fi

# Whether the gateway gave up: its reason, at once, instead of a timeout.
stopped() {
    if [ -n "$pid" ]; then
        # alive unless gone or a zombie (a container's first process may never reap it); the state
        # follows the command's name, which ends at the last ")"
        case "$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null)" in "" | Z*) ;; *) return 1 ;; esac
        tail -n 5 "$state/sepa-gateway.stderr" >&2
    else
        case "$(systemctl show -p SubState --value sepa-gateway)" in auto-restart | failed) ;; *) return 1 ;; esac
        journalctl -u sepa-gateway -n 5 --no-pager -o cat >&2 || true
    fi
    echo "sepa-gateway did not start (above: its last words); logs: $started" >&2
}

# Where the plain gates listen, as the service reads the file: the first `port =` line of any
# section was taken, and 127.0.0.1 asked whatever [http] host said (attack pass).
listen=$("$prefix/bin/python" -I -c 'import sys
from gateway.appliance.config import load_config
config = load_config(sys.argv[1])
print(config.http.host, config.http.port, config.websocket.port)' "$etc/sepa-gateway.toml")
read -r host port ws_port <<<"$listen"
case "$host" in 0.0.0.0 | "") host=127.0.0.1 ;; ::) host=::1 ;; esac
# /health/live, not a connect: another program listening on the port must not pass for the gateway
alive='import json, sys, urllib.request
host = f"[{sys.argv[1]}]" if ":" in sys.argv[1] else sys.argv[1]
sys.exit(json.load(urllib.request.urlopen(f"http://{host}:{sys.argv[2]}/health/live", timeout=1)) != {"status": "alive"})'
read_cert='import os, sys
from broker.security.keys import fingerprint
try:
    with open(os.open(sys.argv[1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as file:
        pem = file.read(65536)
    fingerprint(pem)
except (OSError, ValueError) as error:
    sys.exit(f"install.sh: {sys.argv[1]} not copied: not a certificate the service may read ({error})")
sys.stdout.buffer.write(pem)'
for _ in $(seq 1 60); do
    ! stopped || exit 1
    if "$prefix/bin/python" -I -c "$alive" "$host" "$port" 2>/dev/null; then
        echo "sepa-gateway $("$prefix/bin/sepa-gateway" --version | cut -d' ' -f2) is running: http://localhost:$port/query, http://localhost:$port/update, ws://localhost:$ws_port/subscribe"
        echo "  health: curl http://localhost:$port/health; commands: sepa-gateway --help, sepa-cloud --help"
        cert="$state/data/security/tls-cert.pem"
        for _ in $(seq 1 20); do [ -f "$cert" ] && break; sleep 0.5; done
        # the certificate is public: a copy that clients on this machine can read (the original's
        # directory is the service's alone). Read with the service user's rights, not through a
        # symlink, and only if it is a certificate: that user owns the directory, and root copying
        # what it names made a root-only file world-readable (attack pass).
        if [ -f "$cert" ] && runuser -u sepa-gateway -- "$prefix/bin/python" -I -c "$read_cert" "$cert" >"$etc/tls-cert.pem.new"; then
            chmod 0644 "$etc/tls-cert.pem.new"
            mv -f "$etc/tls-cert.pem.new" "$etc/tls-cert.pem"
            fingerprint=$("$prefix/bin/python" -I -c "import sys; from broker.security.keys import fingerprint; print(fingerprint(open(sys.argv[1], 'rb').read()))" "$etc/tls-cert.pem")
            echo "secure gates: https://$(hostname):8443/secure/query, wss://$(hostname):9443/secure/subscribe"
            echo "  certificate $etc/tls-cert.pem, SHA-256 $fingerprint"
            echo "  allow an application: $prefix/bin/sepa-gateway clients add NAME --read '*' --write GRAPH [--register]"
        else
            rm -f "$etc/tls-cert.pem.new"
        fi
        echo "logs: $started"
        exit 0
    fi
    sleep 0.5
done
echo "sepa-gateway did not answer on port $port within 30 s; logs: $started" >&2
exit 1
