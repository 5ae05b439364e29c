#!/bin/sh
# The image's entrypoint (under tini): TorchServe in the foreground with the container's arguments
# (`--ts-config ... --model-store ...`). TorchServe's launcher starts the frontend (a JVM) and waits for it, but
# dies at once on SIGTERM and forwards nothing; so SIGTERM/SIGINT go to the frontend itself, whose shutdown hook
# closes the listeners and stops the model's workers, and the launcher then returns. Kubernetes sends SIGTERM,
# then SIGKILL after the pod's grace period (30 s by default).
set -u
# The trap first: a SIGTERM from here on is kept, and acted on by the loop below (the trap only notes it), so none
# arriving as TorchServe starts can end this shell and leave TorchServe running.
term=0
trap 'term=1' TERM INT
# The launcher writes the frontend's pid to .model_server.pid in Python's tempfile.gettempdir() ($TMPDIR, else
# $TEMP, $TMP, /tmp: the first that is a writable folder), not always $TMPDIR. Ask Python, and hand its answer to
# the launcher as TMPDIR, so both name the same file whichever Python each runs.
if ! tmp=$(python3 -c 'import tempfile; print(tempfile.gettempdir())'); then
    echo "ts-entrypoint: no writable temporary folder (TMPDIR, TEMP, TMP, /tmp) for TorchServe's pid file"
    exit 1
fi
export TMPDIR="$tmp"
pidfile="$tmp/.model_server.pid"
rm -f "$pidfile"
if [ "$term" = 1 ]; then
    echo "ts-entrypoint: stopped before TorchServe started"
    exit 143
fi
torchserve --start --foreground "$@" &
launcher=$!

running() {  # the launcher runs (not a zombie this shell has yet to reap)
    kill -0 "$launcher" 2>/dev/null || return 1
    read -r stat <"/proc/$launcher/stat" 2>/dev/null || return 0
    case "$stat" in *") Z "*) return 1 ;; esac
}

# After a SIGTERM or SIGINT: forward SIGTERM to the frontend once its pid is known (it appears just after the
# launcher starts it); until then poll, never signal the launcher, which would die and leave the frontend running.
sent=0
status=0
while running; do
    if [ "$term" = 1 ] && [ "$sent" = 0 ]; then
        if [ ! -s "$pidfile" ]; then
            sleep 0.1
            continue
        fi
        echo "ts-entrypoint: stopping TorchServe (frontend pid $(cat "$pidfile"))"
        kill -TERM "$(cat "$pidfile")" 2>/dev/null || true
        sent=1
    fi
    wait "$launcher"   # returns early (>128) when a signal arrives
    status=$?
done
wait "$launcher" 2>/dev/null   # the launcher's own status, if this shell has not collected it above
last=$?
[ "$last" -eq 127 ] || status=$last

others() {  # this container's processes but tini (pid 1) and this shell, zombies aside, in $left (no fork)
    left=""
    for d in /proc/[0-9]*; do
        p=${d#/proc/}
        if [ "$p" = 1 ] || [ "$p" = "$$" ]; then continue; fi
        read -r stat <"$d/stat" 2>/dev/null || continue
        case "$stat" in *") Z "*) continue ;; esac
        left="$left $p"
    done
}
# The frontend stops its workers as it exits, but not always all of them in time (seen here: a process still
# running 5 s after the frontend had exited). End the stragglers ourselves, TERM then KILL, and name them.
wait_others() {  # up to $1 tenths of a second for $left to empty
    i=0
    others
    while [ -n "$left" ] && [ "$i" -lt "$1" ]; do
        sleep 0.1
        i=$((i + 1))
        others
    done
}
# Only as the child of the container's tini: there every process in /proc is TorchServe's (never on a host).
read -r init </proc/1/comm 2>/dev/null || init=""
if [ "$init" != tini ] || [ "$PPID" != 1 ]; then
    echo "ts-entrypoint: TorchServe exited ($status)"
    exit "$status"
fi
wait_others 50
if [ -z "$left" ]; then
    echo "ts-entrypoint: TorchServe exited ($status); no process of it left"
    exit "$status"
fi
for p in $left; do
    echo "ts-entrypoint: still running after TorchServe exited ($status), sent SIGTERM: $p $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)"
    kill -TERM "$p" 2>/dev/null || true
done
wait_others 50
for p in $left; do
    echo "ts-entrypoint: still running 5 s after SIGTERM, sent SIGKILL: $p"
    kill -KILL "$p" 2>/dev/null || true
done
exit "$status"
