#!/usr/bin/env bash
# `make kserve-image-test`: our KServe images (TorchServe's, then the standalone one: config/kserve/standalone/)
# built on a local Debian base, then each run as KServe runs it and checked from the host
# (tests/e2e/test_kserve_image.py, tests/e2e/test_kserve_standalone_image.py); both images' size and cold start last. Needs root, podman, runc, debootstrap and curl (Debian packages),
# Debian's mirror and this machine's pip index; ports 8080-8082 and 7070-7071 free. Prints each phase's time; the
# whole output is also kept in .tmp/kserve-image/last-run.log. Whatever happens, the test container is removed.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
WORK=.tmp/kserve-image
BASE=${KSERVE_BASE_IMAGE:-localhost/bucketing-debian-base:bookworm}
BASE_NO_JRE=${KSERVE_STANDALONE_BASE_IMAGE:-localhost/bucketing-debian-base:bookworm-no-jre}
IMAGE=${KSERVE_IMAGE:-localhost/bucketing-torchserve:test}
STANDALONE_IMAGE=${KSERVE_STANDALONE_IMAGE:-localhost/bucketing-standalone:test}
export KSERVE_PODMAN="podman --runtime runc --cgroup-manager cgroupfs"
export KSERVE_CONTAINER="bucketing-ts-test-$$"
mkdir -p "$WORK"
exec > >(tee "$WORK/last-run.log") 2>&1

cleanup() {
    $KSERVE_PODMAN rm -f -t 0 "$KSERVE_CONTAINER" >/dev/null 2>&1 || true
    $KSERVE_PODMAN rm -f -t 0 "$KSERVE_CONTAINER-sa" >/dev/null 2>&1 || true
}
# Each long step runs as a background child this shell waits for, so that a signal reaches it at once (bash
# would run a trap only after a foreground step ended): the step gets the signal (pytest then tears its fixtures
# down, the container with them), and the container is removed on every way out.
child=""
run() {
    "$@" &
    child=$!
    wait "$child"
    local rc=$?
    child=""
    return "$rc"
}
on_signal() {  # SIGTERM even for Ctrl-C: a background child ignores SIGINT
    if [ -n "$child" ]; then
        kill -TERM "$child" 2>/dev/null || true
        wait "$child" 2>/dev/null || true
    fi
    exit "$1"
}
trap cleanup EXIT
trap 'on_signal 130' INT
trap 'on_signal 143' TERM

for tool in podman runc debootstrap curl; do
    command -v "$tool" >/dev/null || { echo "error: $tool is not installed (apt-get install podman runc debootstrap curl)"; exit 1; }
done
# podman's default rlimits (nofile 1048576, ...) need CAP_SYS_RESOURCE to set, which a machine that is itself a
# container may lack (this one does): build and run with this shell's own limits instead.
nofile=$(ulimit -Hn)
nproc=$(ulimit -Hu)
if [ "$nproc" = unlimited ] || [ "$nproc" -gt 4096 ]; then nproc=4096; fi
export KSERVE_PODMAN_RUN_ARGS="--ulimit nofile=$nofile:$nofile --ulimit nproc=$nproc:$nproc"
start=$SECONDS
phase() { echo "== [$((SECONDS - start)) s] $*"; }

phase "base image $BASE: debootstrap bookworm minbase with python3 (3.11), python3-venv, JRE 17, tini, passwd"
run config/kserve/debian-base.sh "$BASE"
phase "base image $BASE_NO_JRE: the same without the JRE (the standalone image's)"
run config/kserve/debian-base.sh "$BASE_NO_JRE" --no-jre

phase "wheels: pip download (this machine's pip and index) of config/kserve/image-packages.txt, pinned by requirements.txt"
build_requires=$($PY -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')
sed 's/\[[^]]*\]//' requirements.txt >"$WORK/constraints.txt"  # pip takes no extras in a constraint (ray[serve])
# shellcheck disable=SC2086  # the build requirements are separate arguments
$PY -m pip download --quiet --only-binary=:all: -d config/kserve/wheels \
    -c "$WORK/constraints.txt" -r config/kserve/image-packages.txt -r config/kserve/standalone/image-packages.txt \
    $build_requires 2>&1 | { grep -v "is ignored: it is neither" || true; }
echo "$(ls config/kserve/wheels/*.whl | wc -l) wheels, $(du -sh config/kserve/wheels | cut -f1)"

phase "image $IMAGE: podman build, BASE_IMAGE=$BASE, pip offline from the wheels (log: $WORK/build.log)"
# shellcheck disable=SC2086  # the ulimit flags are separate arguments
run $KSERVE_PODMAN build $KSERVE_PODMAN_RUN_ARGS --network host -f config/kserve/Containerfile -t "$IMAGE" \
    --build-arg BASE_IMAGE="$BASE" --build-arg TORCH_INDEX_URL= --build-arg PIP_NO_INDEX=1 . >"$WORK/build.log" 2>&1 \
    || { tail -40 "$WORK/build.log"; exit 1; }
echo "image size: $($KSERVE_PODMAN image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%.2f GB", $1 / 1e9}')"

phase "archive: python -m model_store.build --if-stale"
run $PY -m model_store.build --if-stale

phase "the container as KServe runs it: tests/e2e/test_kserve_image.py"
export KSERVE_IMAGE="$IMAGE"
run $PY -m pytest tests/e2e/test_kserve_image.py -v -s -p no:cacheprovider

phase "standalone image $STANDALONE_IMAGE: podman build -f config/kserve/standalone/Containerfile (no JRE, no TorchServe)"
# shellcheck disable=SC2086  # the ulimit flags are separate arguments
run $KSERVE_PODMAN build $KSERVE_PODMAN_RUN_ARGS --network host -f config/kserve/standalone/Containerfile \
    -t "$STANDALONE_IMAGE" --build-arg BASE_IMAGE="$BASE_NO_JRE" --build-arg TORCH_INDEX_URL= --build-arg PIP_NO_INDEX=1 . \
    >"$WORK/build-standalone.log" 2>&1 || { tail -40 "$WORK/build-standalone.log"; exit 1; }

phase "the standalone container as KServe runs it: tests/e2e/test_kserve_standalone_image.py"
export KSERVE_STANDALONE_IMAGE="$STANDALONE_IMAGE" KSERVE_STANDALONE_CONTAINER="$KSERVE_CONTAINER-sa"
run $PY -m pytest tests/e2e/test_kserve_standalone_image.py -v -s -p no:cacheprovider

phase "both images: size, and cold start (podman run to ready)"
size() { $KSERVE_PODMAN image inspect --format '{{.Size}}' "$1" | awk '{printf "%.2f GB", $1 / 1e9}'; }
cold() { grep -o "$1 [0-9.]* s" "$WORK/last-run.log" | tail -1 | grep -o '[0-9.]* s' || echo '?'; }  # the tests print it
echo "torchserve image: $(size "$IMAGE"), ready $(cold "ready (the runtime.s exec probe)") after podman run"
echo "standalone image: $(size "$STANDALONE_IMAGE"), ready $(cold "ready (/v2/health/ready 200)") after podman run"
phase "done"
