#!/usr/bin/env bash
# Build the registry-free base image kvconform/trixie-base: a debootstrapped Debian trixie minbase root
# (python3 3.13, venv, pip, CA certificates) imported with `docker import`. Idempotent: does nothing when
# the image exists (FORCE=1 rebuilds). Users with an image registry use aiomoqt/Dockerfile.registry instead.
#
# Environment: IMAGE (default kvconform/trixie-base:latest), DEBIAN_MIRROR (default: the mirror of this machine's
# apt sources, kvconform.testbeds.apt_mirror), PYTHON (default python3, with kvconform importable),
# WORKDIR (default a temporary directory), FORCE=1.
set -euo pipefail

IMAGE="${IMAGE:-kvconform/trixie-base:latest}"
MIRROR="${DEBIAN_MIRROR:-$("${PYTHON:-python3}" -m kvconform.testbeds.apt_mirror)}" || {
  echo "base-trixie: no Debian mirror: set DEBIAN_MIRROR, or PYTHON to an interpreter that imports kvconform" >&2
  exit 2
}
SUITE=trixie

if [[ "${FORCE:-0}" != 1 ]] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "base-trixie: $IMAGE exists; skipping (FORCE=1 rebuilds)"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "base-trixie: debootstrap is not installed" >&2; exit 2; }

work="${WORKDIR:-$(mktemp -d /tmp/kvconform-trixie.XXXXXX)}"
root="$work/root"
cleanup() { rm -rf --one-file-system "$work"; }
trap cleanup EXIT

echo "base-trixie: debootstrap $SUITE minbase into $root from $MIRROR"
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
  "$SUITE" "$root" "$MIRROR"

# Trust the CAs the host added locally (e.g. an egress proxy's), so pip inside the image reaches the
# package index exactly as the host does. A host without local CAs adds nothing.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  chroot "$root" update-ca-certificates >/dev/null
fi

# Keep the image small and reproducible-ish: no apt lists, caches or logs.
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/log/*.log "$root"/tmp/*

echo "base-trixie: importing as $IMAGE"
tar --numeric-owner -C "$root" -c . | docker import \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' \
  - "$IMAGE" >/dev/null
docker run --rm --network host "$IMAGE" python3 --version
