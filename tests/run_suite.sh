#!/usr/bin/env bash
# Builds braid against the torch of /usr/bin/python3 and runs its tests:
# the C++ suites (ctest), the Python suites (pytest), and a consumer of the
# installed CMake package. tests/run_all.sh runs this once per torch version.
#
# BRAID_TEST_TIER=fast (default) or all (adds the slow tier);
# BRAID_TEST_SLOW_SHARD=K/N adds shard K of the slow tier's N after the fast tier
# (Note [Slow-tier shards] in tests/python/conftest.py).
# Each phase's time goes to stderr at the end, and to $BRAID_PHASES_FILE when set
# (tests/run_all.sh collects them).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
PY=/usr/bin/python3
tier=${BRAID_TEST_TIER:-fast}
leg=$(. /etc/os-release 2>/dev/null; echo "${VERSION_CODENAME:-host}")
phase_prefix="$leg: " phase_file=${BRAID_PHASES_FILE:-}
. "$repo/tools/phases.sh"
# Every build below (setup.sh's, the C++ tests', pip's) shares the machine's compiler cache,
# with paths hashed relative to the checkout, so that a fresh clone reuses it.
export CCACHE_DIR=${CCACHE_DIR:-/var/cache/braid/ccache} CCACHE_BASEDIR=${CCACHE_BASEDIR:-$repo}
export CCACHE_NOHASHDIR=1 CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-8G}
# setup.sh first: on a fresh machine it is what installs torch.
echo "=== build" >&2
"$repo/tools/setup.sh"
torch_version=$($PY -c 'import torch; print(torch.__version__.split("+")[0])')
pyver=$($PY -c 'import sys; print(f"{sys.version_info.major}{sys.version_info.minor}")')
build="$repo/build/py$pyver-torch$torch_version"

phase "build"
echo "=== torch $torch_version: C++ tests" >&2
cmake --build "$build" -j "$(nproc)" >/dev/null
# No tests is a failure; the tests that did not run (GTEST_SKIP, disabled) are compared with
# tests/skips/cpp-<leg>.txt, fatal under CI=true (Note [Expected skips] in tests/python/skips.py).
rc=0
ctest --test-dir "$build" --output-on-failure --no-tests=error -j "$(nproc)" --timeout 600 \
  2>&1 | tee "$build/ctest.log" || rc=$?
if ! $PY tests/python/skips.py ctest --output "$build/ctest.log" --build "$build" >&2; then
  (( rc != 0 )) || rc=1
fi
(( rc == 0 )) || exit "$rc"

phase "C++ tests"
echo "=== torch $torch_version: installed-package consumer" >&2
prefix="$build/install"
cmake --install "$build" --prefix "$prefix" >/dev/null
cmake -S tests/package -B "$build/consumer" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$build/consumer" -j "$(nproc)" >/dev/null
"$build/consumer/consumer"

phase "installed-package consumer"
echo "=== torch $torch_version: C++ DDP example under torchrun --no_python" >&2
cmake -S examples/cpp -B "$build/example" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$build/example" -j "$(nproc)" >/dev/null
# torchrun picks MASTER_PORT by binding port 0 and closing it; rank 0 binds it again later, and
# an outgoing connection (the rendezvous's own) may take it in between: "Address already in
# use" (a clean-clone CI run, torch 1.13). Only that failure is tried again, on a fresh port.
# USE_LIBUV is unset for it: tools/torchrun must set it where this torch lacks libuv, for the
# agent and for the C++ workers (Note [torchrun without libuv] in tools/torchrun.py), and
# tools/torch2_root.sh sets it in the torch 2.x roots, which would hide a launcher that does not.
log="$build/example/torchrun.log"
for attempt in 1 2 3; do
  rc=0
  (cd "$build/example" && env -u USE_LIBUV OMP_NUM_THREADS=1 timeout 300 "$repo/tools/torchrun" \
    --standalone --nproc_per_node=2 --no_python ./train --checkpoint checkpoint.pt) 2>&1 |
    tee "$log" || rc=$?
  if (( rc == 0 )) || (( attempt == 3 )) || ! grep -q "Address already in use" "$log"; then
    break
  fi
  echo "torchrun lost its port to another socket; trying again (attempt $((attempt + 1)))" >&2
done
(( rc == 0 )) || exit "$rc"

phase "C++ DDP example under torchrun"
echo "=== torch $torch_version: pip install --no-build-isolation . into a venv" >&2
# As a pip user installs braid: into an environment that holds torch, with no
# pybind11 of its own (Note [One pybind11 per process]), then imported from
# outside the repository.
venv="$build/venv"
rm -rf "$venv"
$PY -m venv --system-site-packages "$venv"
BRAID_BUILD_DIR="$build-pip" BRAID_BUILD_TESTS=OFF \
  "$venv/bin/python" -m pip install -q --no-build-isolation --no-deps --no-index "$repo" >&2
(cd "$build" && "$venv/bin/python" -m torch_braid.info | grep -E "^braid|torch  |pybind11") >&2
# What ships holds no simulator (Note [Simulators outside the product]).
"$repo/tools/check_shipped.sh" "$prefix" \
  "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

export PYTHONPATH="$repo/python${PYTHONPATH:+:$PYTHONPATH}"
# The GPU machine's check script in its no-GPU mode (about 30 s), so that it does not rot
# between GPU runs: syntax, the test globs, gpu_smoke.py on the CPU path, the benchmarks' CUDA
# message. On the host only: tools/torch2_root.sh mounts the repository at /braid.
phase "pip install into a venv"
if [[ $repo != /braid ]]; then
  echo "=== torch $torch_version: tools/gpu_check.sh without a GPU" >&2
  BRAID_PYTHON=$PY BRAID_GPU_CHECK_MODE=nogpu "$repo/tools/gpu_check.sh" "$build/gpu-check" >&2
  phase "tools/gpu_check.sh without a GPU"
fi

echo "=== torch $torch_version: Python tests ($tier tier)" >&2
marker=(-m "not slow")
[[ $tier == all ]] && marker=()
$PY -m pytest tests/python -q -p no:cacheprovider "${marker[@]}" ${BRAID_PYTEST_ARGS:-}
phase "Python tests ($tier tier)"
if [[ -n "${BRAID_TEST_SLOW_SHARD:-}" && $tier != all ]]; then
  echo "=== torch $torch_version: Python tests, slow tier shard $BRAID_TEST_SLOW_SHARD" >&2
  $PY -m pytest tests/python -q -p no:cacheprovider -m slow \
    --slow-shard "$BRAID_TEST_SLOW_SHARD" ${BRAID_PYTEST_ARGS:-}
  phase "Python tests (slow shard $BRAID_TEST_SLOW_SHARD)"
fi
[[ -n "${BRAID_PHASES_FILE:-}" ]] || printf 'run_suite: %s\n' "${phases[@]}" >&2
