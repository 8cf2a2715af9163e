#!/usr/bin/env bash
# Builds the torch-free core tests (tests/cpp/test_core_*.cc, linked to
# braid_core only) with a sanitizer and runs them.
#
#   tools/sanitize.sh address          # ASan + UBSan into build-asan
#   tools/sanitize.sh thread           # TSan into build-tsan
#   tools/sanitize.sh all              # both, one after the other
#   tools/sanitize.sh thread --only test_core_stress -- --gtest_filter='P2P*'
#
# Options:
#   --only NAME     run only this test binary (repeatable; default: every test_core_*)
#   --jobs N        parallel compile jobs (default 2, or $JOBS)
#   --no-build      run what is already built
#   --clean         rebuild from scratch (after sources changed while a build ran)
#   -- ARGS         passed to every test binary (e.g. --gtest_filter=...)
# Environment: TEST_TIMEOUT (seconds per binary, default 1800), BUILD_ROOT
# (where build-asan/build-tsan go, default the repository root).
#
# A binary fails when it exits non-zero, prints a sanitizer report (ASan
# error, UBSan "runtime error:", TSan warning), runs past TEST_TIMEOUT, or
# leaves a /dev/shm/braid.* segment behind. The configure step needs torch's
# CMake config (CMakeLists.txt calls find_package(Torch)); the tests
# themselves never load torch.
#
# What the sanitizers can and cannot see here:
# - With threads as ranks, every rank maps every peer's segment at its own
#   address, so the same shared bytes have several virtual addresses in one
#   process. TSan keys its shadow state by address: it reports no race on
#   slot, control or ring memory even when the step protocol is broken
#   (verified by deliberately removing the slot-reuse wait: the tests fail,
#   TSan stays silent). It still checks all process-local state (P2P queues,
#   callbacks, abort flags, settings, the test harness). See tools/tsan.supp.
# - futex(2) is invisible to TSan, but every wake-up is followed by an
#   acquire load of the published counter, which is what orders the data.
# - Reads done by the kernel (process_vm_readv, direct transfers) are seen by
#   neither ASan nor TSan.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_ROOT="${BUILD_ROOT:-$ROOT}"
JOBS="${JOBS:-2}"
TEST_TIMEOUT="${TEST_TIMEOUT:-1800}"

usage() { sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//; /^set -euo/d'; exit "${1:-0}"; }

[[ $# -ge 1 ]] || usage 2
MODE="$1"
shift
ONLY=()
BUILD=1
CLEAN=0
TEST_ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --only) ONLY+=("$2"); shift 2 ;;
    --jobs) JOBS="$2"; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    --clean) CLEAN=1; shift ;;
    --) shift; TEST_ARGS=("$@"); break ;;
    -h|--help) usage 0 ;;
    *) echo "sanitize.sh: unknown argument '$1'" >&2; usage 2 ;;
  esac
done

case "$MODE" in
  address|asan) MODES=(address) ;;
  thread|tsan) MODES=(thread) ;;
  all) MODES=(address thread) ;;
  -h|--help) usage 0 ;;
  *) echo "sanitize.sh: mode must be address, thread or all, got '$MODE'" >&2; exit 2 ;;
esac

if [[ ${#ONLY[@]} -gt 0 ]]; then
  TARGETS=("${ONLY[@]}")
else
  TARGETS=()
  for f in "$ROOT"/tests/cpp/test_core_*.cc; do TARGETS+=("$(basename "$f" .cc)"); done
fi

shm_names_of() {  # braid segments created by pid $1 (names: braid.<pidns>.<pid>.<random>)
  ls /dev/shm 2>/dev/null | grep -E "^braid\.[0-9]+\.$1\." || true
}

FAILED=()
run_mode() {
  local mode="$1" dir flag
  if [[ "$mode" == address ]]; then
    dir="$BUILD_ROOT/build-asan"
    flag="address,undefined"
  else
    dir="$BUILD_ROOT/build-tsan"
    flag="thread"
  fi
  if [[ $BUILD -eq 1 ]]; then
    local launcher=()
    if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
    echo "== configure $dir (-fsanitize=$flag)"
    # Configuring every time also picks up test files added since the last run.
    cmake -S "$ROOT" -B "$dir" -DBRAID_SANITIZE="$flag" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DBRAID_BUILD_TESTS=ON -DBRAID_BUILD_PYTHON=OFF "${launcher[@]}" >"$dir.configure.log" 2>&1 \
      || { cat "$dir.configure.log"; exit 1; }
    if [[ $CLEAN -eq 1 ]]; then cmake --build "$dir" --target clean; fi
    echo "== build ${TARGETS[*]} (-j$JOBS)"
    cmake --build "$dir" -j"$JOBS" --target "${TARGETS[@]}"
  fi

  # halt_on_error=0 everywhere: one run lists every finding; the log decides.
  export ASAN_OPTIONS="detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1:halt_on_error=0:${ASAN_OPTIONS_EXTRA:-}"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=0:${UBSAN_OPTIONS_EXTRA:-}"
  export TSAN_OPTIONS="second_deadlock_stack=1:halt_on_error=0:history_size=4:suppressions=$ROOT/tools/tsan.supp:${TSAN_OPTIONS_EXTRA:-}"

  local t log rc start
  for t in "${TARGETS[@]}"; do
    log="$dir/$t.log"
    echo "== run $mode $t (log: $log)"
    start=$SECONDS
    set +e
    # The pid file gets the test's own pid (exec keeps it), to look for
    # segments it may leave behind.
    timeout --signal=KILL "$TEST_TIMEOUT" bash -c 'echo $$ >"$0"; exec "$@"' "$log.pid" \
      "$dir/$t" "${TEST_ARGS[@]}" >"$log" 2>&1
    rc=$?
    set -e
    local reports leaked
    reports="$(grep -cE 'runtime error:|ERROR: (Address|Leak|Undefined)Sanitizer|WARNING: ThreadSanitizer|ThreadSanitizer: (SEGV|DEADLYSIGNAL)' "$log" || true)"
    leaked=""
    if [[ -s "$log.pid" ]]; then leaked="$(shm_names_of "$(cat "$log.pid")")"; fi
    rm -f "$log.pid"
    local summary
    summary="$(grep -E '^\[  (PASSED|FAILED)  \]' "$log" | tr '\n' ' ')"
    echo "   rc=$rc, $((SECONDS - start)) s, sanitizer reports: $reports; $summary"
    if [[ -n "$leaked" ]]; then
      echo "   leaked /dev/shm segments: $leaked"
      for n in $leaked; do rm -f "/dev/shm/$n"; done
    fi
    if [[ $rc -ne 0 || $reports -ne 0 || -n "$leaked" ]]; then
      FAILED+=("$mode:$t")
      grep -E -A3 'runtime error:|ERROR: .*Sanitizer|WARNING: ThreadSanitizer|^\[  FAILED  \]' \
        "$log" | head -n 60 || true
      if [[ $rc -eq 124 || $rc -eq 137 ]]; then echo "   (killed after ${TEST_TIMEOUT} s)"; fi
    fi
  done
}

for m in "${MODES[@]}"; do run_mode "$m"; done

if [[ ${#FAILED[@]} -gt 0 ]]; then
  echo "sanitize.sh: FAILED: ${FAILED[*]}"
  exit 1
fi
echo "sanitize.sh: all clean (${MODES[*]}: ${TARGETS[*]})"
