#!/usr/bin/env bash
# hack/kind/debian-base.sh: makes a minimal Debian bookworm image, where none can be pulled,
# and prints its name: debootstrap --variant=minbase into a folder, then docker import. It is
# the base of the kind node image and of the glibc component images (hack/kind/node-image.sh);
# apt works in it, from the same mirrors. Built once per key (this script and the mirrors).
#   DEBIAN_MIRROR            default http://deb.debian.org/debian
#   DEBIAN_SECURITY_MIRROR   default http://deb.debian.org/debian-security
# Needs root (debootstrap) and installs Debian's debootstrap with apt if it is missing.
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
log() { echo "debian-base: $*" >&2; }

key=$( (cat "$0"; echo "$suite $mirror $security") | sha256sum | cut -c1-12)
image=zaya-debian:$suite-$key
if docker image inspect "$image" >/dev/null 2>&1; then
	echo "$image"
	exit 0
fi
# One build at a time: hack/kind/e2e.sh builds the PyTorch image beside the node image, and
# both start here. Without the lock, on a machine without debootstrap, the second one's
# apt-get update found the first one's lock on /var/lib/apt/lists (which DPkg::Lock::Timeout
# does not wait for) and ran debootstrap before it was installed (a cold CI run, 2026-11-29).
mkdir -p "$bin/kind-image"
exec 9>"$bin/kind-image/debian-base.lock"
flock 9
if docker image inspect "$image" >/dev/null 2>&1; then
	echo "$image" # the other one built it
	exit 0
fi

[ "$(id -u)" = 0 ] || { log "debootstrap needs root"; exit 1; }
if ! command -v debootstrap >/dev/null || [ ! -e /usr/share/keyrings/debian-archive-keyring.gpg ]; then
	log "installing Debian's debootstrap"
	apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq debootstrap debian-archive-keyring >/dev/null
fi

mkdir -p "$bin/kind-image"
dir=$(mktemp -d "$bin/kind-image/debootstrap.XXXXXX")
# debootstrap mounts proc and sys in the target while it runs: never rm -rf through a mount.
cleanup() {
	findmnt -rn -o TARGET | grep -F "$dir/" | sort -r | xargs -r -n1 umount -l || true
	rm -rf "$dir"
}
trap cleanup EXIT

log "debootstrap $suite (minbase) from $mirror"
start=$SECONDS
debootstrap --variant=minbase --keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
	"$suite" "$dir/rootfs" "$mirror" >"$dir/debootstrap.log" 2>&1 ||
	{ tail -30 "$dir/debootstrap.log" >&2; log "debootstrap failed"; exit 1; }

r=$dir/rootfs
# apt: updates and security fixes too, as debian:bookworm-slim has them.
cat >"$r/etc/apt/sources.list" <<EOF
deb $mirror $suite main
deb $mirror $suite-updates main
deb $security $suite-security main
EOF
# What the images built on it never read (docs, man pages, translations), as Debian's slim
# images leave out; copyright files stay.
cat >"$r/etc/dpkg/dpkg.cfg.d/zaya-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
EOF
rm -rf "$r"/var/lib/apt/lists/* "$r"/var/cache/apt/*.bin "$r"/var/cache/apt/archives/*.deb \
	"$r"/var/log/* "$r"/usr/share/man/* "$r"/usr/share/info/* "$r"/usr/share/locale/*
find "$r/usr/share/doc" -type f ! -name copyright -delete

# Docker provides /dev, /proc and /sys; the tarball carries only the empty folders.
tar --numeric-owner --exclude=./dev/* --exclude=./proc/* --exclude=./sys/* -C "$r" -c . |
	docker import -c 'CMD ["/bin/bash"]' -m "debootstrap --variant=minbase $suite $mirror" - "$image" >/dev/null
log "$image built in $((SECONDS - start))s, $(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}')"
echo "$image"
