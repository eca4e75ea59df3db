#!/usr/bin/env bash
# Make sure PostgreSQL's server binaries are here: the catalog's tests start a server of
# their own from them (initdb into a temporary folder, pg_ctl start on a Unix socket), so
# nothing is started here. Debian puts them in /usr/lib/postgresql/<version>/bin; as root
# on Debian, install the postgresql package where they are missing. Idempotent.
set -euo pipefail

if compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null || command -v pg_ctl >/dev/null; then
    exit 0
fi

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "PostgreSQL is not installed: install its server package (Debian: apt-get install postgresql) and retry." >&2
    exit 1
fi

echo "spillbox: installing postgresql (the catalog's tests run against a real server)" >&2
apt-get update -q >/dev/null
# The package's own cluster is not needed (the tests make theirs): do not start it.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    trap 'rm -f "$policy"' EXIT
fi
DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null
compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null
