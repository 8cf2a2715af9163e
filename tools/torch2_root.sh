#!/usr/bin/env bash
# Runs a command inside a Debian root that has torch 2.x (trixie: torch 2.6;
# forky: torch 2.14), made with debootstrap on first use, with this repository
# bind-mounted at /braid.
#
#   tools/torch2_root.sh [--suite trixie|forky] -- COMMAND...
#   tools/torch2_root.sh [--suite trixie|forky] --prepare     (make the root only)
#
# BRAID_ROOT_DIR (default /var/tmp/braid-roots) holds the roots; they are
# reused across runs. Needs root (debootstrap, mount, chroot).
set -euo pipefail

suite=trixie
prepare_only=0
if [[ "${1:-}" == "--suite" ]]; then suite=$2; shift 2; fi
# --prepare: make (or complete) the root and stop; tests/run_all.sh runs it in the
# background while the first leg's tests run.
if [[ "${1:-}" == "--prepare" ]]; then prepare_only=1; shift; fi
[[ "${1:-}" == "--" ]] && shift

repo=$(cd "$(dirname "$0")/.." && pwd)
base=${BRAID_ROOT_DIR:-/var/tmp/braid-roots}
root=$base/$suite
pkgs=python3-torch,libtorch-dev,pybind11-dev,python3-pytest,g++,cmake,make,python3-dev,python3-setuptools,ccache,libgtest-dev,procps,python3-matplotlib,python3-venv,python3-pip,iproute2
# torch 2.14's Python headers include <fmt/format.h>; its libtorch-dev does not pull it in.
[[ $suite == trixie ]] || pkgs+=,libfmt-dev
# Hugging Face Accelerate (tests/python/test_clients_accelerate.py): Debian ships it from forky on.
[[ $suite == trixie ]] || pkgs+=,python3-accelerate

if [[ ! -f $root/.braid-ready ]]; then
  command -v debootstrap >/dev/null || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap
  }
  echo "torch2_root: creating $suite root in $root (a few minutes)" >&2
  rm -rf "$root"
  mkdir -p "$base"
  # Bookworm's debootstrap knows no forky (testing): its sid script with the
  # suite name works, given the mirror that apt uses here.
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  mirror=${mirror:-http://deb.debian.org/debian}
  script=()
  [[ -f /usr/share/debootstrap/scripts/$suite ]] || script=(/usr/share/debootstrap/scripts/sid)
  debootstrap --variant=minbase --include=$pkgs "$suite" "$root" "$mirror" "${script[@]}" \
    >"$base/$suite.log" 2>&1 || {
    tail -20 "$base/$suite.log" >&2
    exit 1
  }
  touch "$root/.braid-ready"
fi
# A root made by an older version of this script may lack a package added since.
missing=()
for p in ${pkgs//,/ }; do
  chroot "$root" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$p")
done
if ((${#missing[@]})); then
  echo "torch2_root: installing ${missing[*]} in the $suite root" >&2
  cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
  chroot "$root" /bin/bash -c "apt-get -o Acquire::Check-Valid-Until=false update -qq && DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends ${missing[*]}" >"$base/$suite-extra.log" 2>&1 || {
    tail -20 "$base/$suite-extra.log" >&2
    exit 1
  }
fi

# braid needs no OpenSSL headers (Note [libcrypto at run time] in
# csrc/transport/tcp/auth.h): the trixie leg proves it by building without
# them. Roots persist across runs, and older ones were made with libssl-dev.
# libcrypto itself (libssl3t64) stays: python3 depends on it.
if [[ $suite == trixie ]] &&
  chroot "$root" dpkg-query -W -f='${Status}' libssl-dev 2>/dev/null | grep -q "install ok installed"; then
  echo "torch2_root: removing libssl-dev from the $suite root (braid builds without it)" >&2
  chroot "$root" /bin/bash -c "DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq libssl-dev" \
    >"$base/$suite-remove.log" 2>&1 || {
    tail -20 "$base/$suite-remove.log" >&2
    exit 1
  }
fi

((prepare_only)) && exit 0

# The mounts live in a private mount namespace of this command: they vanish
# with it, and runs from several checkouts (worktrees) at once do not see or
# unmount each other's /braid.
if [[ -z "${BRAID_ROOT_NS:-}" ]]; then
  exec env BRAID_ROOT_NS=1 unshare --mount --propagation private "$0" --suite "$suite" -- "$@"
fi
# The root becomes a mount point of its own, so that "/" inside is one: `ip netns` and
# `unshare --propagation` (tools/hosts.py) change the propagation of "/", which fails on a
# directory that is not a mount.
mount --bind "$root" "$root"
bind() {  # bind SRC DST
  mkdir -p "$2"
  mount --bind "$1" "$2"
}
bind /proc "$root/proc"
bind /dev "$root/dev"
bind /dev/shm "$root/dev/shm"
bind "$repo" "$root/braid"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
# torchrun and c10d resolve this host's name; the root must know it too.
cp /etc/hosts "$root/etc/hosts" 2>/dev/null || true

# Debian's torch 2.6 has no libuv TCPStore.
env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root USE_LIBUV=0 CI="${CI:-}" \
  BRAID_TEST_TIER="${BRAID_TEST_TIER:-fast}" BRAID_TEST_SLOW_SHARD="${BRAID_TEST_SLOW_SHARD:-}" \
  BRAID_PHASES_FILE="${BRAID_PHASES_FILE:-}" BRAID_STRICT_SKIPS="${BRAID_STRICT_SKIPS:-}" \
  BRAID_SKIPS_WRITE="${BRAID_SKIPS_WRITE:-}" CCACHE_DIR=/var/cache/braid/ccache \
  chroot "$root" /bin/bash -c 'cd /braid && "$@"' bash "$@"
