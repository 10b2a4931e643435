#!/usr/bin/env bash
# `make image-check`: build docker/Dockerfile and try the image, on a machine that reaches no image registry.
#
# 1. The base: Debian bookworm made locally with debootstrap (python3, python3-venv, a venv on PATH at
#    /opt/venv, this machine's CA bundle so pip trusts what the host trusts), imported into podman as
#    $BASE. Made once; kept in podman's storage for later runs (IMAGE_CHECK_FRESH_BASE=1 remakes it).
# 2. The image: `podman build --isolation chroot` of docker/Dockerfile with PYTHON_IMAGE=$BASE.
# 3. The try: `buildah run --isolation chroot` starts `skrull serve` in a container of the image, on the
#    host's network; docker/image_probe.py submits examples/requests/contract-example.json, waits for its
#    plan and reads a rank view. The container is removed afterwards, pass or fail.
# Needs root and Debian's podman, buildah and debootstrap (apt-get install podman buildah debootstrap).
set -euo pipefail
cd "$(dirname "$0")/.."
BASE="${IMAGE_CHECK_BASE:-localhost/skrull-python-base:bookworm}"
IMAGE="${IMAGE_CHECK_IMAGE:-localhost/skrull:check}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
HOST_CA=/etc/ssl/certs/ca-certificates.crt

for tool in podman buildah debootstrap python3; do
    command -v "$tool" >/dev/null || { echo "image-check: $tool is missing (apt-get install podman buildah debootstrap)" >&2; exit 1; }
done

work="$(mktemp -d)"
ctr=""
server=""
cleanup() {
    if [ -n "$server" ]; then kill -TERM "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
    if [ -n "$ctr" ]; then buildah rm "$ctr" >/dev/null 2>&1 || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

if [ "${IMAGE_CHECK_FRESH_BASE:-0}" = 1 ] || ! podman image exists "$BASE"; then
    start=$SECONDS
    debootstrap --variant=minbase --include=python3,python3-venv bookworm "$work/root" "$MIRROR" >"$work/debootstrap.log" \
        || { tail -n 20 "$work/debootstrap.log" >&2; echo "image-check: debootstrap of bookworm failed" >&2; exit 1; }
    chroot "$work/root" python3 -m venv /opt/venv
    changes=(--change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin')
    if [ -f "$HOST_CA" ]; then  # pip's own bundle would refuse a TLS-inspecting proxy the host trusts
        install -D -m 0644 "$HOST_CA" "$work/root$HOST_CA"
        changes+=(--change "ENV PIP_CERT=$HOST_CA" --change "ENV SSL_CERT_FILE=$HOST_CA")
    fi
    tar -C "$work/root" -c . | podman import --quiet "${changes[@]}" - "$BASE" >/dev/null
    rm -rf "$work/root"
    echo "image-check: base $BASE made in $((SECONDS - start)) s"
fi

start=$SECONDS
podman build --quiet --format docker --isolation chroot --build-arg PYTHON_IMAGE="$BASE" \
    -f docker/Dockerfile -t "$IMAGE" . >/dev/null
echo "image-check: $IMAGE built in $((SECONDS - start)) s"

ctr="$(buildah from "$IMAGE")"
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
buildah run --isolation chroot "$ctr" -- \
    skrull serve --host 127.0.0.1 --port "$port" --db /data/skrull.db --solver-processes 1 >"$work/serve.log" 2>&1 &
server=$!
if ! python3 docker/image_probe.py "http://127.0.0.1:$port"; then
    tail -n 40 "$work/serve.log" >&2
    exit 1
fi
