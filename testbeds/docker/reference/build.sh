#!/usr/bin/env bash
# Build the reference image (kvconform's reference implementations under the container contract) from this
# checkout: a wheel built on the host (no dependencies), copied into a build context with ./Dockerfile; pip
# inside the build (host network) installs the wheel's dependencies from PyPI. Every step is bounded.
#
# Environment: IMAGE (default kvconform/reference:dev), BASE (default kvconform/trixie-base:latest, made by
# ../base-trixie.sh), PYTHON (the host interpreter that builds the wheel; default python3).
set -euo pipefail

IMAGE="${IMAGE:-kvconform/reference:dev}"
BASE="${BASE:-kvconform/trixie-base:latest}"
PYTHON="${PYTHON:-python3}"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"

docker image inspect "$BASE" >/dev/null 2>&1 || { echo "reference image: base image $BASE is missing (../base-trixie.sh)" >&2; exit 2; }
ctx="$(mktemp -d /tmp/kvconform-reference-image.XXXXXX)"
trap 'rm -rf "$ctx"' EXIT
mkdir "$ctx/wheels"
cp "$here/Dockerfile" "$ctx/"
echo "reference image: wheel of $root"
timeout 300 "$PYTHON" -m pip wheel -q --no-deps --disable-pip-version-check -w "$ctx/wheels" "$root"
echo "reference image: building $IMAGE"
timeout 900 docker build -q --network host --build-arg "BASE=$BASE" -t "$IMAGE" "$ctx"
