#!/usr/bin/env bash
# Builds the libFuzzer target for the TCP frame decoder and runs it for a
# bounded time, printing the number of executions.
#
#   tests/fuzz/run.sh [SECONDS]     (default 60, or $BRAID_FUZZ_SECONDS)
#
# Starts from the checked-in seeds (tests/fuzz/corpus/tcp_frame/, left
# untouched); inputs it finds go to build/fuzz/corpus_tcp_frame. A crash
# leaves its input in build/fuzz/ (crash-*) and fails the script. Needs
# clang with libFuzzer (Debian: clang, libclang-rt-14-dev); installs them
# with apt when missing and running as root, else skips saying why (fails under CI=true).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
secs=${1:-${BRAID_FUZZ_SECONDS:-60}}
out="$repo/build/fuzz"
mkdir -p "$out/corpus_tcp_frame"

find_cxx() { command -v clang++-14 || command -v clang++ || true; }
cxx=${BRAID_FUZZ_CXX:-$(find_cxx)}
if [[ -z $cxx ]] || ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "fuzz: installing clang and libclang-rt-14-dev" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends clang \
      libclang-rt-14-dev >/dev/null
    cxx=${BRAID_FUZZ_CXX:-$(find_cxx)}
  else
    why="clang++ with libFuzzer is not installed (apt install clang libclang-rt-14-dev)"
    # Under CI a fuzzer that cannot be built is a failure, not a skip (Note [Expected skips]
    # in tests/python/skips.py).
    ci=${CI:-}
    if [[ ${BRAID_STRICT_SKIPS:-} == 1 ]] ||
       [[ ${BRAID_STRICT_SKIPS:-} != 0 && ${ci,,} =~ ^(true|1|yes)$ ]]; then
      echo "fuzz: FAILED: $why; under CI=true (or BRAID_STRICT_SKIPS=1) that is no skip" >&2
      exit 1
    fi
    echo "fuzz: skipped: $why" >&2
    exit 0
  fi
fi

start=$SECONDS
"$cxx" -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I "$repo/csrc" "$repo/tests/fuzz/fuzz_tcp_frame.cc" "$repo/csrc/transport/tcp/frame.cc" \
  -o "$out/fuzz_tcp_frame"
built=$((SECONDS - start))
log="$out/fuzz_tcp_frame.log"
set +e
(cd "$out" && ./fuzz_tcp_frame -max_total_time="$secs" -print_final_stats=1 -max_len=4096 \
  corpus_tcp_frame "$repo/tests/fuzz/corpus/tcp_frame") >"$log" 2>&1
rc=$?
set -e
execs=$(awk '/stat::number_of_executed_units/ {print $2}' "$log")
if [[ $rc -ne 0 ]]; then
  tail -40 "$log" >&2
  echo "fuzz: fuzz_tcp_frame FAILED (rc $rc) after ${execs:-?} executions; log: $log" >&2
  exit 1
fi
echo "fuzz: fuzz_tcp_frame ran ${execs:-?} executions in ${secs} s without a finding" \
  "(built in ${built} s; corpus: $(ls "$out/corpus_tcp_frame" | wc -l) found + seeds)" >&2
