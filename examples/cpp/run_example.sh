#!/usr/bin/env bash
# Installs braid into PREFIX, builds examples/cpp against the installed
# package (find_package(Braid)), and trains it on 2 ranks with torchrun.
#
#   examples/cpp/run_example.sh PREFIX [WORK_DIR]
#
# WORK_DIR holds both build trees and the checkpoint (default: a temporary
# directory, removed on exit). BRAID_JOBS sets the build parallelism (2).
set -euo pipefail
if [[ $# -lt 1 ]]; then
  echo "usage: $0 PREFIX [WORK_DIR]" >&2
  exit 2
fi
repo=$(cd "$(dirname "$0")/../.." && pwd)
prefix=$(realpath -m "$1")
if [[ $# -ge 2 ]]; then
  work=$(realpath -m "$2")
  mkdir -p "$work"
else
  work=$(mktemp -d -t braid-example.XXXXXX)
  trap 'rm -rf "$work"' EXIT
fi
jobs=${BRAID_JOBS:-2}
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi

echo "== install braid into $prefix" >&2
cmake -S "$repo" -B "$work/braid-build" -DCMAKE_BUILD_TYPE=Release \
  -DBRAID_BUILD_TESTS=OFF -DBRAID_BUILD_PYTHON=OFF -DCMAKE_INSTALL_PREFIX="$prefix" \
  "${launcher[@]}" >/dev/null
cmake --build "$work/braid-build" -j"$jobs"
cmake --install "$work/braid-build" >/dev/null

echo "== build examples/cpp against it" >&2
cmake -S "$repo/examples/cpp" -B "$work/example-build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" "${launcher[@]}" >/dev/null
cmake --build "$work/example-build" -j"$jobs"

if [[ -x /usr/bin/torchrun ]]; then
  torchrun=(/usr/bin/torchrun)
else
  torchrun=(/usr/bin/python3 -m torch.distributed.run)
fi
# torch 1.13's torchrun on Python 3.11 turns the default --redirects/--tee
# value "0" into None (Python 3.11 iterates a Flag without its 0 member) and
# fails before starting any worker; "1" (stdout) parses on every version.
extra=()
if ! /usr/bin/python3 -c 'import sys; from torch.distributed.elastic.multiprocessing.api import Std; sys.exit(Std.from_str("0") is None)' 2>/dev/null; then
  extra=(--redirects 1 --tee 1)
fi
echo "== ${torchrun[*]} --nproc_per_node=2 ${extra[*]} --no_python ./train" >&2
cd "$work/example-build"
# A free port, so that concurrent runs on one machine do not collide.
port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
OMP_NUM_THREADS=1 timeout "${BRAID_EXAMPLE_TIMEOUT:-300}" "${torchrun[@]}" \
  --nproc_per_node=2 --master_addr=127.0.0.1 --master_port="$port" "${extra[@]}" --no_python \
  ./train --checkpoint "$work/checkpoint.pt"
