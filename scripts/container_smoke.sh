#!/usr/bin/env bash
# Build Narwhal's container image (Containerfile) and smoke-test it, with no image registry:
#
#   1. a local base image, localhost/narwhal-base:bookworm: Debian bookworm (minbase, with
#      python3, python3-venv and ca-certificates) made by debootstrap from the Debian mirror
#      this machine's apt uses, imported into buildah's storage; made once, then reused
#      (its root filesystem is kept in $NARWHAL_CONTAINER_CACHE, default /var/tmp/...);
#   2. the image, `buildah bud --isolation chroot` on that base (pip fetches the
#      dependencies from the package index during the build);
#   3. the image's ENTRYPOINT (`narwhal serve`, the embedded default: router and simulated
#      engines) started by `buildah run --isolation chroot` on a free port of the host's
#      loopback; /health, /ready and one chat completion with curl; then SIGTERM, and the
#      router must exit 0. The working container is removed; the images are kept.
#
# Every step is bounded in time. Needs root (buildah's storage, debootstrap); buildah,
# debootstrap and curl are installed with apt-get when missing. Prints each step's time
# and the image's size. `podman run` is not used: it needs cgroups these machines lack.
#
#   scripts/container_smoke.sh          (tests/deploy/test_container_smoke.py runs it when
#                                        NARWHAL_CONTAINER_SMOKE=1)
# Environment: NARWHAL_IMAGE (default localhost/narwhal:smoke), NARWHAL_CONTAINER_CACHE,
# DEBIAN_MIRROR (default: the mirror of this machine's Debian sources).
set -euo pipefail
cd "$(dirname "$0")/.."

SUITE=bookworm # Debian 12: its python3 is 3.11, the version the Containerfile names
BASE_IMAGE=localhost/narwhal-base:$SUITE
IMAGE=${NARWHAL_IMAGE:-localhost/narwhal:smoke}
CACHE=${NARWHAL_CONTAINER_CACHE:-/var/tmp/narwhal-container}
HOST_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
MODEL=narwhal-sim # the embedded default's model (narwhal/serve.py)

container=""
run_pid=""
started=$(date +%s.%N)

say() { printf '%s\n' "container smoke: $*"; }
fail() {
    say "FAILED: $*" >&2
    exit 1
}
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(date +%s.%N)"; }

cleanup() {
    if [ -n "$run_pid" ] && kill -0 "$run_pid" 2>/dev/null; then
        # timeout passes SIGTERM to buildah run, which kills the router.
        kill -TERM "$run_pid" 2>/dev/null || true
        wait "$run_pid" 2>/dev/null || true
    fi
    if [ -n "$container" ]; then
        timeout 60 buildah rm "$container" >/dev/null 2>&1 || true
    fi
}
trap cleanup EXIT

require_tools() {
    local missing=()
    for tool in buildah debootstrap curl python3; do
        command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
    done
    [ ${#missing[@]} -eq 0 ] && return
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        say "installing ${missing[*]} with apt-get"
        timeout 300 apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        fail "missing ${missing[*]} (install them, as root: apt-get install ${missing[*]})"
    fi
}

# The Debian archive this machine's apt reads (not the security archive), so debootstrap
# goes where apt already goes.
debian_mirror() {
    if [ -n "${DEBIAN_MIRROR:-}" ]; then
        echo "$DEBIAN_MIRROR"
        return
    fi
    local site
    site=$(apt_debian_site)
    if [ -z "$site" ] && [ "$(id -u)" = 0 ]; then # apt has no lists yet
        timeout 300 apt-get update -qq >/dev/null
        site=$(apt_debian_site)
    fi
    [ -n "$site" ] || fail "no Debian mirror in apt's sources; set DEBIAN_MIRROR"
    echo "$site"
}

apt_debian_site() {
    # shellcheck disable=SC2016 # $(SITE) is apt's placeholder, not the shell's
    apt-get indextargets --format '$(SITE)' 'Label: Debian' 'Component: main' \
        'Identifier: Packages' 2>/dev/null | head -n 1
}

build_base() {
    local t0 rootfs mirror working mount
    t0=$(date +%s.%N)
    if buildah inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; then
        say "base $BASE_IMAGE: present, reused"
        return
    fi
    rootfs=$CACHE/rootfs-$SUITE
    mkdir -p "$CACHE"
    if [ ! -e "$rootfs.complete" ]; then
        mirror=$(debian_mirror)
        say "base: debootstrap $SUITE from $mirror (log: $CACHE/debootstrap.log)"
        rm -rf "$rootfs.partial" "$rootfs"
        timeout 900 debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
            "$SUITE" "$rootfs.partial" "$mirror" >"$CACHE/debootstrap.log" 2>&1 ||
            fail "debootstrap failed, see $CACHE/debootstrap.log"
        # What a slim image leaves out: downloaded packages, apt's lists, documentation.
        rm -rf "$rootfs.partial"/var/cache/apt/archives/*.deb "$rootfs.partial"/var/lib/apt/lists/* \
            "$rootfs.partial"/usr/share/doc "$rootfs.partial"/usr/share/man \
            "$rootfs.partial"/usr/share/locale/*
        mv "$rootfs.partial" "$rootfs"
        touch "$rootfs.complete"
    fi
    working=$(timeout 60 buildah from scratch)
    mount=$(timeout 60 buildah mount "$working")
    timeout 300 cp -a "$rootfs/." "$mount/"
    timeout 60 buildah umount "$working" >/dev/null
    timeout 60 buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --cmd '["python3"]' "$working"
    timeout 300 buildah commit --quiet --rm "$working" "$BASE_IMAGE" >/dev/null
    say "base $BASE_IMAGE: made in $(since "$t0") s"
}

build_image() {
    local t0 trust=()
    t0=$(date +%s.%N)
    # pip in the build trusts what this host trusts (a TLS-inspecting proxy's CA among
    # them) through a mount for the RUN steps only: the host's bundle enters no layer.
    [ -r "$HOST_CA_BUNDLE" ] && trust=(--volume "$HOST_CA_BUNDLE:$HOST_CA_BUNDLE:ro")
    timeout 900 buildah bud --isolation chroot --layers "${trust[@]}" \
        --build-arg "BASE=$BASE_IMAGE" --tag "$IMAGE" --file Containerfile . \
        >"$CACHE/build.log" 2>&1 || fail "the image build failed, see $CACHE/build.log"
    say "image $IMAGE: built in $(since "$t0") s, $(buildah images --format '{{.Size}}' "$IMAGE" | head -n 1)"
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Poll URL until its answer contains PATTERN (or TIMEOUT seconds pass).
wait_for() {
    local url=$1 pattern=$2 timeout_s=$3 deadline answer
    deadline=$(($(date +%s) + timeout_s))
    while [ "$(date +%s)" -lt "$deadline" ]; do
        kill -0 "$run_pid" 2>/dev/null || fail "the router exited; its log: $CACHE/serve.log"
        answer=$(curl --silent --noproxy '*' --max-time 5 "$url" || true)
        if grep -q "$pattern" <<<"$answer"; then
            echo "$answer"
            return
        fi
        sleep 0.2
    done
    fail "$url did not answer $pattern within $timeout_s s (last: ${answer:-nothing})"
}

# The router's own process (named after narwhal's script) under buildah's: SIGTERM goes to
# it, since buildah run answers SIGTERM by killing its command.
router_pid() {
    local pids=("$run_pid") pid child
    while [ ${#pids[@]} -gt 0 ]; do
        pid=${pids[0]}
        pids=("${pids[@]:1}")
        if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = narwhal ]; then
            echo "$pid"
            return
        fi
        for child in $(pgrep -P "$pid" || true); do pids+=("$child"); done
    done
}

# One field of the image's OCI configuration (a list as shell words).
image_config() {
    buildah inspect --type image "$IMAGE" | python3 -c '
import json, shlex, sys
value = json.load(sys.stdin)["OCIv1"]["config"].get(sys.argv[1])
print(shlex.join(value) if isinstance(value, list) else value or "")' "$1"
}

smoke_run() {
    local t0 port url entrypoint user uid pid status answer
    user=$(image_config User)
    [ "$user" = "10001:10001" ] || fail "the image's USER is '$user', not 10001:10001"
    container=$(timeout 60 buildah from --name "narwhal-smoke-$$" "$IMAGE")
    uid=$(timeout 60 buildah run --isolation chroot "$container" -- id -u)
    [ "$uid" = 10001 ] || fail "the container runs as uid $uid"
    timeout 60 buildah run --isolation chroot "$container" -- python -c "import uvloop" ||
        fail "uvloop is not importable in the image"
    # The image's own ENTRYPOINT, with the embedded default's arguments in place of CMD.
    entrypoint=$(image_config Entrypoint)
    [ -n "$entrypoint" ] || fail "the image has no ENTRYPOINT"
    port=$(free_port)
    url=http://127.0.0.1:$port
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086 # entrypoint: words quoted by shlex.join
    timeout 300 buildah run --isolation chroot "$container" -- $entrypoint \
        --host 127.0.0.1 --port "$port" >"$CACHE/serve.log" 2>&1 &
    run_pid=$!
    wait_for "$url/health" . 60 >/dev/null
    say "/health answered $(since "$t0") s after start"
    wait_for "$url/ready" '"ready": *true' 60 >/dev/null
    say "/ready true $(since "$t0") s after start"
    answer=$(curl --silent --show-error --noproxy '*' --max-time 30 --fail-with-body \
        "$url/v1/chat/completions" \
        -H 'Content-Type: application/json' \
        -d "{\"model\": \"$MODEL\", \"max_tokens\": 8, \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]}") ||
        fail "the chat completion failed: $answer"
    python3 -c 'import json, sys; c = json.loads(sys.argv[1])["choices"][0]; assert c["message"]["content"], c' \
        "$answer" || fail "the chat completion has no content: $answer"
    say "chat completion: 200, $(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["usage"])' "$answer")"
    pid=$(router_pid)
    [ -n "$pid" ] || fail "cannot find the router's process"
    t0=$(date +%s.%N)
    kill -TERM "$pid"
    status=0
    wait "$run_pid" || status=$?
    run_pid=""
    [ "$status" = 0 ] || fail "the router exited with status $status after SIGTERM; log: $CACHE/serve.log"
    say "SIGTERM: the router exited 0 in $(since "$t0") s"
}

require_tools
[ "$(id -u)" = 0 ] || fail "run as root (buildah's storage and debootstrap need it)"
mkdir -p "$CACHE"
build_base
build_image
smoke_run
say "passed in $(since "$started") s"
