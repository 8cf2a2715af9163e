#!/usr/bin/env bash
# Every test, on a fresh Debian bookworm machine as on a developer's:
#   1. torch 1.13 from bookworm (installed with apt when missing);
#   2. torch 2.x from Debian trixie, in a root made with debootstrap
#      (tools/torch2_root.sh; about 2 GB, made once and reused).
# Needs root (apt, debootstrap, chroot). BRAID_SKIP_TORCH2=1 skips step 2.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
start=$SECONDS
"$repo/tests/run_suite.sh"
if [[ "${BRAID_SKIP_TORCH2:-0}" != 1 ]]; then
  "$repo/tools/torch2_root.sh" -- tests/run_suite.sh
fi
if [[ "${BRAID_SKIP_TORCH2:-0}" == 1 ]]; then versions="torch 1.13 only"; else versions="torch 1.13 and torch 2.x"; fi
echo "run_all: every suite passed on $versions in $((SECONDS - start)) s" >&2
