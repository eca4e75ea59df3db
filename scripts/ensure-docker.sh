#!/usr/bin/env bash
# Make sure a Docker engine answers. Users normally have one; fresh CI machines
# of this project have only the client, so as root on Debian we install
# docker.io and start dockerd in the background. Idempotent.
set -euo pipefail

if docker info >/dev/null 2>&1; then
    exit 0
fi

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "Docker is not running: start the Docker engine (e.g. 'sudo systemctl start docker') and retry." >&2
    exit 1
fi

if ! command -v dockerd >/dev/null; then
    echo "spillbox: installing docker.io (no Docker engine on this machine)" >&2
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io >/dev/null
fi

# gVisor (runsc) is spillbox's stronger sandbox option, and the attack tests run under
# it too where the engine has it; register it before we start dockerd ourselves. Its
# netstack is not needed: sandboxes have no network.
register_gvisor() {
    if ! command -v runsc >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q runsc >/dev/null 2>&1 || return 0
    fi
    mkdir -p /etc/docker
    python3 - <<'PY'
import json, pathlib, shutil
path = pathlib.Path("/etc/docker/daemon.json")
config = json.loads(path.read_text()) if path.exists() else {}
config.setdefault("runtimes", {})["runsc"] = {
    "path": shutil.which("runsc"),
    "runtimeArgs": ["--network=none"],
}
path.write_text(json.dumps(config, indent=2) + "\n")
PY
}

# The default engine is the dockerd whose pid file is /var/run/docker.pid: another dockerd
# (one on a socket and data root of its own) is not it, and must not stop us starting it.
default_engine_runs() {
    local pid
    pid=$(cat /var/run/docker.pid 2>/dev/null) || return 1
    [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ]
}

if ! default_engine_runs; then
    register_gvisor
    # A dockerd killed without cleanup leaves its pid file behind and refuses to start.
    rm -f /var/run/docker.pid
    echo "spillbox: starting dockerd in the background (log: /var/log/spillbox-dockerd.log)" >&2
    nohup dockerd >>/var/log/spillbox-dockerd.log 2>&1 &
fi

for _ in $(seq 1 60); do
    if docker info >/dev/null 2>&1; then
        exit 0
    fi
    sleep 1
done
echo "Docker did not answer within 60 s: see /var/log/spillbox-dockerd.log" >&2
exit 1
