#!/usr/bin/env bash
# Every test, on a fresh Debian bookworm machine as on a developer's, once per
# torch that CI covers:
#   1. torch 1.13 from bookworm (installed with apt when missing);
#   2. torch 2.6 from Debian trixie, in a root made with debootstrap;
#   3. torch 2.14 from Debian forky (testing), in a second root.
# The roots (tools/torch2_root.sh; about 2 GB each) are made once and reused.
# Needs root (apt, debootstrap, chroot).
# Before them, once (it needs no torch): the TCP frame decoder's fuzzer for
# BRAID_FUZZ_SECONDS (default 60; tests/fuzz/run.sh), about 75 s in all.
#   BRAID_SKIP_FUZZ=1          skips the fuzzer;
#   BRAID_SKIP_TORCH2=1        runs step 1 only;
#   BRAID_TORCH2_SUITES="..."  picks the roots (default "trixie forky").
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
start=$SECONDS
# Every cited Note exists, once, as a block, where its citations say (no torch needed).
echo "=== notes" >&2
python3 "$repo/tools/check_notes.py" --self-test
python3 "$repo/tools/check_notes.py"
if [[ "${BRAID_SKIP_FUZZ:-0}" != 1 ]]; then
  echo "=== fuzz: TCP frame decoder" >&2
  "$repo/tests/fuzz/run.sh" "${BRAID_FUZZ_SECONDS:-60}"
fi
"$repo/tests/run_suite.sh"
versions=("torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)")
if [[ "${BRAID_SKIP_TORCH2:-0}" != 1 ]]; then
  for suite in ${BRAID_TORCH2_SUITES:-trixie forky}; do
    echo "=== $suite root" >&2
    "$repo/tools/torch2_root.sh" --suite "$suite" -- tests/run_suite.sh
    versions+=("torch $("$repo/tools/torch2_root.sh" --suite "$suite" -- \
      python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)")
  done
fi
summary=$(IFS=,; echo "${versions[*]}")
echo "run_all: every suite passed on ${summary//,/, } in $((SECONDS - start)) s" >&2
