#!/usr/bin/env bash
# Build the dpsub image from deploy/Dockerfile with podman, on a Debian bookworm base built
# locally from Debian's packages (no image registry needed), and print its size:
#
#   deploy/build-image.sh                      # → localhost/dpsub:<version of pyproject.toml>
#   IMAGE=localhost/dpsub:test deploy/build-image.sh
#   BASE=python:3.11.7-slim-bookworm deploy/build-image.sh   # the Dockerfile's own base
#
# Needs: apt-get update && apt-get install -y podman runc mmdebstrap (run as root). The runc
# runtime and the ulimits suit sandboxes where crun and podman's default limits are refused;
# pip in the build reaches the index over the host's network with the host's CA bundle.
# --format docker keeps the Dockerfile's HEALTHCHECK (the OCI format has none). The image's
# Python is the base's: Debian bookworm's python3 (3.11.2) on the default base.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/pyproject.toml" | head -1)
IMAGE=${IMAGE:-localhost/dpsub:$VERSION}
BASE=${BASE:-localhost/debian-python:bookworm}
PODMAN=(podman --runtime runc)
LIMITS=(--ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
CA=/etc/ssl/certs/ca-certificates.crt

if [[ $BASE == localhost/debian-python:* ]] && ! "${PODMAN[@]}" image exists "$BASE"; then
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  echo "building the base $BASE with mmdebstrap (a few minutes)" >&2
  mmdebstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$scratch/base.tar"
  "${PODMAN[@]}" import "$scratch/base.tar" "$BASE" >/dev/null
fi

start=$(date +%s)
"${PODMAN[@]}" build "${LIMITS[@]}" --network host --volume "$CA:$CA:ro" \
  --format docker --from "$BASE" --file "$ROOT/deploy/Dockerfile" \
  --ignorefile "$ROOT/deploy/Dockerfile.dockerignore" --tag "$IMAGE" "$ROOT"
took=$(($(date +%s) - start))
python=$("${PODMAN[@]}" run --rm "${LIMITS[@]}" --entrypoint python "$IMAGE" --version)
echo "built $IMAGE from $BASE in $took s;" \
  "size $("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE") bytes; $python" >&2
