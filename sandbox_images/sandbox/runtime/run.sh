#!/bin/sh
# Runs one code-mode script: run.sh TIMEOUT sh|python CODE
#
# `timeout` puts the script in its own process group and signals the whole group when
# time is up (TERM, then KILL 2 s later). When the script ends, in time or not, what it
# left running in its group (`cmd &`, nohup) is killed too; and if no other script of
# the task is running, so is every process of the script uid, which catches one that
# left its group with setsid. After a timeout the host sweeps the uid again, once no
# other script of the task is running.
# Whether the memory limit killed something is read from the cgroup's oom_kill counter
# before and after, and reported on stderr for the host to strip. The last stderr line is
# always the end mark: without it, the host knows this runner did not end by itself (a
# gVisor sandbox that died under it) and asks Docker what became of the sandbox.
limit="$1" lang="$2" code="$3"

# Sets $oom to the cgroup's oom_kill count (v2 or v1), with shell builtins only: a
# fork per exec is a measurable share of a 70 ms round trip.
read_oom() {
    oom=""
    for events in /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control; do
        [ -r "$events" ] || continue
        while read -r key value; do
            if [ "$key" = oom_kill ]; then oom=$value; return; fi
        done < "$events"
    done
}

case "$lang" in
    python) set -- python3 -c "$code" ;;
    sh) set -- sh -c "$code" ;;
    *) echo "run.sh: unknown language $lang" >&2; exit 2 ;;
esac

read_oom
before=$oom
timeout -s TERM -k 2 "$limit" "$@" &
group=$!
wait "$group"
status=$?
kill -KILL -- "-$group" 2>/dev/null
# Another script runs if another process of the uid was entered from outside (docker exec):
# those, and only those, have parent 0, which no process inside can fake; a name can be.
if [ "$(pgrep -c -P 0 -u 10001)" -le 1 ]; then
    kill -KILL -1 2>/dev/null
fi
read_oom
if [ "$oom" != "$before" ]; then
    printf '\036spillbox:oom_killed\n' >&2
fi
printf '\036spillbox:end\n' >&2
exit "$status"
