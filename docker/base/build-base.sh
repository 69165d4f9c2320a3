#!/usr/bin/env bash
# Build heapcast's base image from Debian's own packages (no image registry is reachable):
# debootstrap a minbase bookworm from the host's apt source, then `docker import` it.
#
#   docker/base/build-base.sh [IMAGE]      default IMAGE: heapcast/base:bookworm
#
# Idempotent: an image already present under that name is left alone (HEAPCAST_REBUILD=1
# forces a rebuild). Needs root (debootstrap), debootstrap, and an engine at DOCKER_HOST.
set -euo pipefail

IMAGE=${1:-heapcast/base:bookworm}
SUITE=bookworm
SOURCES=${HEAPCAST_APT_SOURCES:-/etc/apt/sources.list.d/debian.sources}
say() { echo "build-base.sh: $*" >&2; }

if [ -z "${HEAPCAST_REBUILD:-}" ] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
    say "$IMAGE already built ($(docker image inspect -f '{{.Id}}' "$IMAGE")); skipping"
    exit 0
fi
command -v debootstrap >/dev/null || { say "debootstrap is missing: apt-get install -y debootstrap"; exit 1; }
[ "$(id -u)" = 0 ] || { say "debootstrap needs root"; exit 1; }

# The mirror: the first URIs line of the deb822 source that serves the suite (the host's own
# Debian mirror, the one place packages are reachable from), else a one-line sources.list.
MIRROR=""
if [ -f "$SOURCES" ]; then
    MIRROR=$(awk '/^URIs:/ {print $2; exit}' "$SOURCES")
fi
if [ -z "$MIRROR" ] && [ -f /etc/apt/sources.list ]; then
    MIRROR=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list)
fi
MIRROR=${MIRROR:-http://deb.debian.org/debian}

WORK=$(mktemp -d /var/tmp/heapcast-base.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
ROOTFS="$WORK/rootfs"
say "debootstrap --variant=minbase $SUITE from $MIRROR"
debootstrap --variant=minbase "$SUITE" "$ROOTFS" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 || {
    say "debootstrap failed; last lines of its log:"; tail -n 30 "$WORK/debootstrap.log" >&2; exit 1; }

# The same apt sources inside the image, so `RUN apt-get install` in workload Dockerfiles
# reaches the same mirror (and the security suite) as the host.
if [ -f "$SOURCES" ]; then
    rm -f "$ROOTFS/etc/apt/sources.list"
    cp "$SOURCES" "$ROOTFS/etc/apt/sources.list.d/debian.sources"
fi
# Smaller images: no docs or man pages from later installs, no cached .debs.
cat > "$ROOTFS/etc/dpkg/dpkg.cfg.d/01-heapcast-nodoc" <<'CFG'
path-exclude /usr/share/doc/*
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
CFG
cat > "$ROOTFS/etc/apt/apt.conf.d/01-heapcast" <<'CFG'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
CFG
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*

say "importing as $IMAGE"
tar -C "$ROOTFS" -c . | docker import \
    -c 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'CMD ["/bin/bash"]' \
    -m "heapcast base: debootstrap --variant=minbase $SUITE" - "$IMAGE" >&2
say "built $IMAGE ($(docker image inspect -f '{{.Id}}' "$IMAGE"))"
