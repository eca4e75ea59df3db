#!/bin/sh
# Runs one code-mode script: run.sh TIMEOUT sh|python CODE
#
# `timeout` puts the script in its own process group and signals the whole group when
# time is up (TERM, then KILL 2 s later), so children die with it; the host sweeps any
# process that escaped the group (setsid) after a timeout. Whether the memory limit
# killed something is read from the cgroup's oom_kill counter, before and after, and
# reported as the last stderr line for the host to strip.
limit="$1" lang="$2" code="$3"

oom_kills() {
    sed -n 's/^oom_kill //p' /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null | head -n 1
}

before=$(oom_kills)
case "$lang" in
    python) timeout -s TERM -k 2 "$limit" python3 -c "$code" ;;
    sh) timeout -s TERM -k 2 "$limit" sh -c "$code" ;;
    *) echo "run.sh: unknown language $lang" >&2; exit 2 ;;
esac
status=$?
if [ "$(oom_kills)" != "$before" ]; then
    printf '\036spillbox:oom_killed\n' >&2
fi
exit "$status"
