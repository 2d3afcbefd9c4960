#!/bin/sh
# Prints the Mosquitto configuration the installer writes to /etc/mosquitto/conf.d/sepa-gateway.conf:
# systemd/mosquitto-sepa-gateway.conf with its placeholders filled. A script of its own so that the
# tests start a real Mosquitto on exactly the text the installer writes.
#   mosquitto-conf.sh PASSWORD_FILE LISTENER LOCAL_LISTENER [TLS_LISTENER TLS_CERT TLS_KEY]
# LISTENER is "1883" (every interface) or "PORT ADDRESS"; LOCAL_LISTENER the gateway's own, on this
# board ("1884 127.0.0.1"); the three TLS arguments turn on the TLS listener. No argument may contain
# "|". The ACL file is the password file's name with .acl for .passwd
# (gateway/appliance/mqtt_acl.py acl_file: `sepa-gateway sensors` writes it). LAN_CONNECTIONS in the
# environment: each LAN listener's max_connections (default 32256, for Mosquitto's 65536 open files).
set -eu
if [ "$#" -ne 3 ] && [ "$#" -ne 6 ]; then
    echo "usage: $0 PASSWORD_FILE LISTENER LOCAL_LISTENER [TLS_LISTENER TLS_CERT TLS_KEY]" >&2
    exit 2
fi
template="$(dirname "$0")/mosquitto-sepa-gateway.conf"
acl="${1%.passwd}.acl"
lan="${LAN_CONNECTIONS:-32256}"
if [ "$#" -eq 6 ]; then
    sed -e "s|^#TLS ||" -e "s|@TLS_PORT@|$4|" -e "s|@TLS_CERT@|$5|" -e "s|@TLS_KEY@|$6|" \
        -e "s|@PASSWORD_FILE@|$1|" -e "s|@ACL_FILE@|$acl|" -e "s|@PORT@|$2|" -e "s|@LOCAL_LISTENER@|$3|" -e "s|@LAN_CONNECTIONS@|$lan|" "$template"
else
    sed -e "s|@PASSWORD_FILE@|$1|" -e "s|@ACL_FILE@|$acl|" -e "s|@PORT@|$2|" -e "s|@LOCAL_LISTENER@|$3|" -e "s|@LAN_CONNECTIONS@|$lan|" "$template"
fi
