#!/usr/bin/env bash
# Removes what systemd/install.sh installed: the service, /opt/sepa-gateway, the sepa-gateway and
# sepa-cloud commands and Mosquitto's sepa-gateway listener. Keeps the configuration
# (/etc/sepa-gateway), the data (/var/lib/sepa-gateway), the sensors' MQTT logins and the service
# user, so that install.sh brings the gateway back as it was; --purge removes those too. The Debian
# packages install.sh added (mosquitto, python3-venv...) stay: other software may use them.
# Run it as root, or as a user who may use sudo: ./systemd/uninstall.sh [--purge]
set -euo pipefail
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 && exec sudo -- "$0" "$@"
    echo "uninstall.sh: run it as root (e.g. su -c '$0'): there is no sudo here" >&2
    exit 1
fi
purge=false
case "${1:-}" in
    --purge) purge=true ;;
    "") ;;
    *) echo "usage: $0 [--purge]" >&2; exit 2 ;;
esac

prefix=/opt/sepa-gateway
etc=/etc/sepa-gateway
state=/var/lib/sepa-gateway

if [ -d /run/systemd/system ]; then
    systemctl disable --now sepa-gateway >/dev/null 2>&1 || true
    rm -f /etc/systemd/system/sepa-gateway.service
    systemctl daemon-reload
elif pkill -f "$prefix/bin/sepa-gateway run"; then  # no systemd: the background gateway of install.sh
    for _ in $(seq 1 120); do pgrep -f "$prefix/bin/sepa-gateway run" >/dev/null || break; sleep 0.1; done
fi
for command in sepa-gateway sepa-cloud; do
    # only our own links: a command of that name installed otherwise stays
    [ "$(readlink "/usr/local/bin/$command" 2>/dev/null)" != "$prefix/bin/$command" ] || rm -f "/usr/local/bin/$command"
done
rm -rf "$prefix" "$prefix.previous" "$prefix.rejected"  # the last two: left by an interrupted install

# Mosquitto goes back to its own configuration (no LAN listener); the logins stay unless --purge
if [ -f /etc/mosquitto/conf.d/sepa-gateway.conf ]; then
    rm -f /etc/mosquitto/conf.d/sepa-gateway.conf
    if [ -d /run/systemd/system ]; then
        rm -f /etc/systemd/system/mosquitto.service.d/sepa-gateway.conf
        systemctl daemon-reload
        systemctl try-restart mosquitto || true
    elif pkill -f "mosquitto -d -c /etc/mosquitto/mosquitto.conf"; then
        for _ in $(seq 1 100); do pgrep -f "mosquitto -d -c /etc/mosquitto/mosquitto.conf" >/dev/null || break; sleep 0.1; done
        mosquitto -d -c /etc/mosquitto/mosquitto.conf
    fi
fi

if "$purge"; then
    rm -rf "$etc" "$state"
    rm -f /etc/mosquitto/sepa-gateway.passwd /etc/mosquitto/sepa-gateway.acl /etc/mosquitto/certs/sepa-gateway.pem /etc/mosquitto/certs/sepa-gateway.key
    ! id -u sepa-gateway >/dev/null 2>&1 || userdel sepa-gateway
    echo "sepa-gateway removed, with its configuration, data, logins and user (--purge)"
else
    echo "sepa-gateway removed; kept: $etc (configuration), $state (data), /etc/mosquitto/sepa-gateway.passwd" \
        "and .acl (sensors' logins and topics) and the sepa-gateway user. ./systemd/install.sh brings it back; --purge removes them"
fi
