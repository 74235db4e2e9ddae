#!/usr/bin/env bash
# deploy/bounded.sh SECONDS LABEL COMMAND...: runs COMMAND with its output line-buffered (so a log shows how far it
# got, not the last 4 KiB block it flushed), and if it is still running after SECONDS, prints every thread's
# backtrace of each Swift test process (gdb, when installed) and stops the whole command. A hang then fails the
# step with evidence in minutes instead of using up CI's time limit with nothing to show.
#
# COMMAND runs in a session of its own (setsid): `swift test` starts the test process in another process group, so
# the session is what finds and stops all of it. The watchdog's own sleep holds none of our output, so nothing
# left behind keeps a pipe reading this script's output open.
set -uo pipefail
limit=$1 label=$2
shift 2
setsid stdbuf -oL -eL "$@" &
pid=$!
(
    sleep "$limit" </dev/null >/dev/null 2>&1
    kill -0 "$pid" 2>/dev/null || exit 0
    echo "== $label: still running after ${limit}s; thread backtraces of the test processes, then stopping it" >&2
    for test_pid in $(pgrep -s "$pid" -f 'PackageTests.xctest'); do
        if command -v gdb >/dev/null; then
            echo "== backtraces of $test_pid" >&2
            timeout 180 gdb -p "$test_pid" -batch -iex 'set complaints 0' -ex 'thread apply all bt 25' 2>&1 |
                grep -v -e '^\[New LWP' -e '^During symbol reading' -e '^warning: Section' | head -1500 >&2
        fi
    done
    pkill -TERM -s "$pid"
    sleep 10 </dev/null >/dev/null 2>&1
    pkill -KILL -s "$pid"
) &
watchdog=$!
wait "$pid"
status=$?
pkill -P "$watchdog" 2>/dev/null
kill "$watchdog" 2>/dev/null
wait "$watchdog" 2>/dev/null
if [ "$status" -ge 128 ]; then echo "== $label: stopped (status $status)" >&2; fi
exit "$status"
