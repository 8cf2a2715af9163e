#!/usr/bin/env bash
# Every test, on a fresh Debian bookworm machine as on a developer's, once per
# torch that CI covers:
#   1. torch 1.13 from bookworm (installed with apt when missing);
#   2. torch 2.6 from Debian trixie, in a root made with debootstrap;
#   3. torch 2.14 from Debian forky (testing), in a second root.
# The roots (tools/torch2_root.sh; about 2 GB each) are made once and reused; on a
# fresh machine they are made in the background while step 1 runs (debootstrap
# waits on the network, the tests on the CPU). Needs root (apt, debootstrap, chroot).
# Before them, once (they need no torch): the Note checker, and the TCP frame
# decoder's fuzzer for BRAID_FUZZ_SECONDS (default 60; tests/fuzz/run.sh).
# Each leg runs the fast tier and one shard of the slow tier (Note [Slow-tier
# shards] in tests/python/conftest.py): shard (commits on main) mod BRAID_SLOW_SHARDS.
#   BRAID_SKIP_FUZZ=1          skips the fuzzer;
#   BRAID_SKIP_TORCH2=1        runs step 1 only;
#   BRAID_TORCH2_SUITES="..."  picks the roots (default "trixie forky");
#   BRAID_SLOW_SHARDS=N        the slow tier's shards (default 8; 0: no slow tier);
#   BRAID_TEST_SLOW_SHARD=K/N  runs that shard instead.
# At the end it prints each phase's time.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
start=$SECONDS
. "$repo/tools/phases.sh"
report() {
  echo "run_all: phase times (wall clock):" >&2
  printf '  %s\n' "${phases[@]}" >&2
}
trap 'rc=$?; ((rc == 0)) || { phase "(failed here)"; report; }' EXIT

suites=()
[[ "${BRAID_SKIP_TORCH2:-0}" == 1 ]] || suites=(${BRAID_TORCH2_SUITES:-trixie forky})
if ((${#suites[@]})); then
  command -v debootstrap >/dev/null || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  }
  logs=${BRAID_ROOT_DIR:-/var/tmp/braid-roots}
  mkdir -p "$logs"
  declare -A prep
  for suite in "${suites[@]}"; do
    "$repo/tools/torch2_root.sh" --suite "$suite" --prepare >"$logs/$suite-prepare.log" 2>&1 &
    prep[$suite]=$!
  done
fi

# Every cited Note exists, once, as a block, where its citations say (no torch needed).
echo "=== notes" >&2
python3 "$repo/tools/check_notes.py" --self-test
python3 "$repo/tools/check_notes.py"
phase "notes"
if [[ "${BRAID_SKIP_FUZZ:-0}" != 1 ]]; then
  echo "=== fuzz: TCP frame decoder" >&2
  "$repo/tests/fuzz/run.sh" "${BRAID_FUZZ_SECONDS:-60}"
  phase "fuzz"
fi

shards=${BRAID_SLOW_SHARDS:-8}
if [[ -z "${BRAID_TEST_SLOW_SHARD:-}" ]] && ((shards > 0)); then
  commits=$(git -C "$repo" rev-list --count HEAD 2>/dev/null || echo 0)
  export BRAID_TEST_SLOW_SHARD="$((commits % shards))/$shards"
  echo "run_all: slow tier shard $BRAID_TEST_SLOW_SHARD ($commits commits on this branch, mod $shards)" >&2
fi

BRAID_PHASES_FILE=$(mktemp)
export BRAID_PHASES_FILE
"$repo/tests/run_suite.sh"
phase_start=$SECONDS  # run_suite.sh reports its own phases
while read -r line; do phases+=("$line"); done <"$BRAID_PHASES_FILE"
versions=("torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)")
for suite in "${suites[@]}"; do
  echo "=== $suite root" >&2
  if ! wait "${prep[$suite]}"; then
    tail -30 "$logs/$suite-prepare.log" >&2
    echo "run_all: making the $suite root failed (log: $logs/$suite-prepare.log)" >&2
    exit 1
  fi
  phase "$suite root: wait for it"
  : >"$BRAID_PHASES_FILE"
  # The root sees the repository at /braid: the phases go through a file there.
  rel=build/phases-$suite.txt
  mkdir -p "$repo/build"
  : >"$repo/$rel"
  BRAID_PHASES_FILE=/braid/$rel "$repo/tools/torch2_root.sh" --suite "$suite" -- tests/run_suite.sh
  phase_start=$SECONDS
  while read -r line; do phases+=("$line"); done <"$repo/$rel"
  versions+=("torch $("$repo/tools/torch2_root.sh" --suite "$suite" -- \
    python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)")
done
rm -f "$BRAID_PHASES_FILE"
summary=$(IFS=,; echo "${versions[*]}")
report
echo "run_all: every suite passed on ${summary//,/, } in $((SECONDS - start)) s" >&2
