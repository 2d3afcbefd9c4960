#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian / Raspberry Pi OS machine, then runs
# the whole suite (lint included). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)

# Debian packages the tests use (real services, not mocks). Java runs the cloud tests' local Spark;
# Chromium (with its driver) is the browser of the page tests (tests/browser_support.py); strace traces
# the syncs of the durability test (tests/broker/test_durability.py); libcoap3-bin is libcoap's coap-client,
# the real client of the CoAP tests (tests/adapters/coap); util-linux (unshare, nsenter, setpriv), iproute2
# and curl run systemd/install.sh in namespaces of its own (tests/systemd/test_install.py, as root);
# libmimalloc2.0 is the installed service's malloc (systemd/sepa-gateway.service; tools/launcher.py); faketime
# steps the wall clock of a gateway process (tests/support/clock.py).
packages=(python3 python3-venv python3-pip mosquitto mosquitto-clients openjdk-17-jre-headless chromium chromium-driver strace
    libcoap3-bin util-linux iproute2 curl libmimalloc2.0 faketime)
missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
    "${sudo_cmd[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}"
fi

# Debian's libcoap3-bin has coap-client-notls / -gnutls / -openssl but no plain coap-client, the name
# every CoAP guide (and our README) uses.
if ! command -v coap-client >/dev/null; then
    "${sudo_cmd[@]}" ln -sf "$(command -v coap-client-notls)" /usr/local/bin/coap-client
fi

# Node.js runs the SEPA project's JavaScript client (tests/broker/gates/test_sepa_js.py), installed from the
# committed lock file. A machine that already has node and npm (e.g. NodeSource's) keeps them.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    "${sudo_cmd[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq nodejs npm
fi
(cd tests/broker/gates/js && npm ci --no-audit --no-fund --loglevel=error)

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e '.[test]'

.venv/bin/ruff check .
exec .venv/bin/python -m pytest "$@"
