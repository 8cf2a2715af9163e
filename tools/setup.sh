#!/usr/bin/env bash
# Installs what braid needs from Debian's archive (when missing) and builds
# the extension in place. Safe to re-run: apt is skipped when all is there,
# and the build is incremental (ccache).
#
# Uses /usr/bin/python3: Debian's python3-torch lives there, and the python3
# first on PATH may be another interpreter without torch.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
PY=${BRAID_PYTHON:-/usr/bin/python3}

pkgs=(python3-torch libtorch-dev pybind11-dev python3-pytest python3-dev python3-setuptools
      cmake g++ make ccache libgtest-dev python3-matplotlib python3-venv python3-pip)
# No libssl-dev: braid loads OpenSSL's libcrypto at run time (Note [libcrypto at run time] in
# csrc/transport/tcp/auth.h); python3's own dependencies bring the library.
# (The fuzzer's clang and libclang-rt-14-dev are installed by tests/fuzz/run.sh, which runs on
# the bookworm host only: they are not needed to build, and forky has no libclang-rt-14-dev.)
[[ "${BRAID_SETUP_EXTRA:-}" ]] && pkgs+=(${BRAID_SETUP_EXTRA})
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""; [[ $(id -u) != 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cd "$repo"
# One cache per machine, outside the checkout, so that a fresh clone (CI's) compiles what
# another clone compiled already: CCACHE_BASEDIR makes the paths in the hash relative.
export CCACHE_DIR=${CCACHE_DIR:-/var/cache/braid/ccache} CCACHE_BASEDIR=${CCACHE_BASEDIR:-$repo}
export CCACHE_NOHASHDIR=1 CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-8G}
echo "setup: building torch_braid for $($PY -c 'import torch; print("torch", torch.__version__)')" >&2
log=$(mktemp)
# BRAID_BUILD_SIM: the tests' simulated CUDA device (tests/sim), which pip never builds.
if ! BRAID_BUILD_SIM=${BRAID_BUILD_SIM:-1} BRAID_JOBS=${BRAID_JOBS:-$(nproc)} \
    $PY setup.py build_ext --inplace >"$log" 2>&1; then
  tail -60 "$log" >&2
  echo "setup: build failed (full log: $log)" >&2
  exit 1
fi
# Which pybind11 and C++ standard the build took (cmake/TorchPybind11.cmake).
grep -h "^-- braid: " "$log" >&2 || true
rm -f "$log"
