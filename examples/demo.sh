#!/usr/bin/env bash
# Sets up braid on a fresh Debian machine (apt + build) and runs the demo:
# 2-process torchrun DDP training on braid, with gloo's step time beside it.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
"$repo/tools/setup.sh"
export PYTHONPATH="$repo/python${PYTHONPATH:+:$PYTHONPATH}"
exec "$repo/tools/torchrun" --standalone --nproc_per_node=2 \
  "$repo/examples/demo.py" "$@"
