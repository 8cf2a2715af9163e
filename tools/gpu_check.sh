#!/usr/bin/env bash
# One pass of braid's CUDA checks on a GPU machine, in under 8 minutes; without a GPU, the
# parts that need none (CI runs that mode: tests/run_suite.sh).
#
#   tools/gpu_check.sh OUTDIR            # from the repository root; OUTDIR gets the logs
#   BRAID_GPU_STEPS=smoke,bench tools/gpu_check.sh OUTDIR     # only steps whose name matches
#                                        # (and env, gtest, build, import: incremental on a rerun)
#   tools/gpu_check.sh --list            # the steps, in order, with their time limits
#   tools/gpu_check.sh --prepare-kit [DIR]   # here, before the GPU run (see "The kit")
#
# Writes OUTDIR/summary.txt: one line per step, "PASS|FAIL|SKIP  name  seconds  reason", and
# OUTDIR/NN-name.log per step (also the JSON of the smoke test and the benchmarks). Exits 1
# when a step failed, else 0. Every step runs under its own `timeout`; the run as a whole keeps
# to BRAID_GPU_BUDGET_S (default 450 s): a step never runs past it, and steps that would start
# after BRAID_GPU_SKIP_AFTER_S (default 420 s) are skipped, so the summary is written in time.
#
# GPU mode (nvidia-smi lists a GPU; BRAID_GPU_CHECK_MODE=gpu|nogpu forces it):
#   env        versions: nvidia-smi -L, nvcc, torch, torch.version.cuda, NCCL, tools found
#   gtest      GoogleTest from the kit when the machine has none (C++ tests need it)
#   build      cmake -> /tmp/braid-gpu-build (BRAID_GPU_BUILD_DIR), -j$(nproc), kernels on
#              (BRAID_CUDA_KERNELS=ON when nvcc is found), ccache if present; the _C module is
#              copied into python/torch_braid/ (this checkout is the machine's copy), then
#              the C++ targets test_cuda_* (globbed: later tests are picked up)
#   import     import torch_braid; python -m torch_braid.info
#   in the background, while the GPU steps run (CPU only):
#     py-errors  tests/python/test_error_exit.py (the torch 2.11 SIGSEGV check), 4 pytests at once
#     py-fast    a short fast-tier subset (pooled worlds, forkserver)
#     py-NAME    tests/python/test_cuda*sim*.py (the simulated device)
#   cpp-NAME   each test_cuda_* binary, on the device (BRAID_EXPECT_GPU=1: a test that finds no
#              CUDA runtime or GPU fails instead of skipping)
#   smoke-wN   tools/gpu_smoke.py: worlds of 1, 2, 4 and 8 ranks on CUDA tensors (closed forms,
#              stream order, async, DDP against gloo's CUDA run); with one GPU, 2 to 8 ranks
#              share it and run braid's same-GPU collectives
#   py-NAME    each other tests/python/test_cuda*.py (BRAID_TEST_REAL_CUDA=1, BRAID_EXPECT_GPU=1)
#   memcheck-*, racecheck-*   compute-sanitizer over the test binaries that drive the device
#              (test_cuda*{kernel,runtime,real}*; racecheck: the kernel ones), in the background
#              one after another, beside the smoke worlds
#   bench-*    benchmarks/collectives.py --device cuda --quick at 2, 4, 8, 1 ranks, then
#              benchmarks/ddp.py --device cuda --quick (4 ranks), after the background steps
#   examples   examples/*.py on braid with CUDA, where they take a device option
#   bench-scaling  tools/scaling_check.sh OUTDIR/scaling (issue 30: braid and gloo on the CPU at
#              2 to 32 ranks, table, JSON and PNG), last, with what is left of the budget (at
#              most 240 s; its sweep fits itself into the step's limit, and the step is skipped
#              with under 60 s left): a full run rarely leaves that much, so run it alone with
#              BRAID_GPU_STEPS=scaling (env, build and import, then the sweep)
# No-GPU mode: env, syntax of these scripts (and the --help of scaling.py and scaling_check.sh),
# import, the test globs (pytest --collect-only of test_cuda*.py), gpu_smoke.py --dry-run and
# its CPU run (world 2), the benchmarks' "no CUDA" message; the rest is skipped with the reason.
# It builds nothing (it needs the in-place module: tools/setup.sh) and takes about 30 s on 2 cores.
#
# The kit: the GPU machine has no network, and may lack GoogleTest and pytest. `--prepare-kit`
# copies this machine's GoogleTest sources (/usr/src/googletest) and pytest (pure Python, with
# pluggy, iniconfig, packaging, attrs) into build/gpu-kit (about 7 MB); pass it to the GPU run
# as a carried path (build/ is ignored by git). The check uses the machine's own pytest and
# GoogleTest first, the kit's otherwise, and skips with the reason when neither is there.
#
# Environment: BRAID_PYTHON (default /opt/torch/.venv/bin/python3 if present, else
# /usr/bin/python3), BRAID_GPU_BUILD_DIR, BRAID_GPU_KIT (default build/gpu-kit),
# BRAID_GPU_BUDGET_S, BRAID_GPU_SKIP_AFTER_S, BRAID_GPU_STEPS (comma list of substrings),
# BRAID_GPU_SANITIZE_FILTER (gtest filter under compute-sanitizer, default '*'),
# BRAID_GPU_BUILD_LIMIT_S (the build step's limit, default 270), BRAID_GPU_CHECK_MODE,
# BRAID_GPU_INPLACE (Note [Where the module goes]).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd -P)
cd "$repo" || exit 2

# ---- the kit (run here, not on the GPU machine) --------------------------------------------------
if [[ ${1:-} == --prepare-kit ]]; then
  kit=${2:-$repo/build/gpu-kit}
  rm -rf "$kit" && mkdir -p "$kit/py" || exit 1
  cp -r /usr/src/googletest "$kit/googletest" || { echo "no /usr/src/googletest (apt install libgtest-dev)"; exit 1; }
  dp=/usr/lib/python3/dist-packages
  for m in pytest _pytest pluggy iniconfig packaging attr attrs py.py; do
    cp -r "$dp/$m" "$kit/py/" || { echo "missing $dp/$m (apt install python3-pytest)"; exit 1; }
  done
  cp -r "$dp"/pytest-*.dist-info "$kit/py/" 2>/dev/null
  find "$kit" -name __pycache__ -prune -exec rm -rf {} +
  echo "kit: $kit ($(du -sh "$kit" | cut -f1)): GoogleTest $(grep -m1 -oE 'GOOGLETEST_VERSION [0-9.]+' \
    "$kit/googletest/CMakeLists.txt" | cut -d' ' -f2), pytest $(PYTHONPATH=$kit/py /usr/bin/python3 \
    -c 'import pytest; print(pytest.__version__)')"
  exit 0
fi

# ---- configuration -------------------------------------------------------------------------------
if [[ -n ${BRAID_PYTHON:-} ]]; then PY=$BRAID_PYTHON
elif [[ -x /opt/torch/.venv/bin/python3 ]]; then PY=/opt/torch/.venv/bin/python3
else PY=/usr/bin/python3; fi
BUILD=${BRAID_GPU_BUILD_DIR:-/tmp/braid-gpu-build}
KIT=${BRAID_GPU_KIT:-$repo/build/gpu-kit}
BUDGET=${BRAID_GPU_BUDGET_S:-450}
SKIP_AFTER=${BRAID_GPU_SKIP_AFTER_S:-420}
ONLY=${BRAID_GPU_STEPS:-}
JOBS=$(nproc 2>/dev/null || echo 4)
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
MODE=${BRAID_GPU_CHECK_MODE:-}
GPU_SEEN=0
nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && GPU_SEEN=1
[[ -z $MODE ]] && { ((GPU_SEEN)) && MODE=gpu || MODE=nogpu; }
# Note [Where the module goes]
# The Python tests import torch_braid from python/ (tests/python/harness.py puts it first on
# sys.path unless it is there already). On the GPU machine the checkout is a copy made for this
# run, so the build copies _C there; anywhere else (a forced BRAID_GPU_CHECK_MODE=gpu on a shared
# checkout) it must not replace the in-place module, so the package is staged in $BUILD/py, ahead
# of python/ on PYTHONPATH.
INPLACE=${BRAID_GPU_INPLACE:-$GPU_SEEN}
export PY BUILD KIT JOBS CUDA_HOME repo MODE INPLACE GPU_SEEN
# The venv's bin: pip's ninja and cmake live there when the venv has them.
export PATH="$CUDA_HOME/bin:$(dirname "$PY"):$PATH"
export PYTHONPATH="$repo/python${PYTHONPATH:+:$PYTHONPATH}"
[[ $MODE == gpu && $INPLACE != 1 ]] && PYTHONPATH="$BUILD/py:$PYTHONPATH"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1

# Steps in order, with their limits (seconds).
if [[ ${1:-} == --list ]]; then
  cat <<'EOF'
GPU mode (limits in seconds; the whole run keeps to BRAID_GPU_BUDGET_S):
  env 30, gtest 60, build 270 (BRAID_GPU_BUILD_LIMIT_S), import 60
  background, CPU only: py-errors 150, py-fast 120, py-test_cuda*sim* 150 each
  foreground: cpp-test_cuda* 90 each; then in the background, one after another,
              memcheck-* and racecheck-* 120 each; in the foreground smoke-w1 90,
              smoke-w2 90, smoke-w4 100, smoke-w8 100, py-test_cuda* (not sim) 120 each
  after the background steps: bench-coll-w2 75, bench-coll-w4 90, bench-coll-w8 90,
              bench-coll-w1 60,
              bench-ddp 90, examples 60, bench-scaling 240 (what is left of the budget;
              skipped under 60)
no-GPU mode: env 30, syntax 30, build (skipped: needs the in-place module), import 30,
  globs 40, smoke-dry 30, smoke-cpu 60, bench-nocuda 40; every GPU step is skipped
EOF
  exit 0
fi
OUT=${1:-${OUT:-}}
[[ -n $OUT ]] || { echo "usage: tools/gpu_check.sh OUTDIR | --list | --prepare-kit [DIR]" >&2; exit 2; }
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd -P)
export OUT
SUMMARY=$OUT/summary.txt
STATUS=$OUT/.status
rm -rf "$STATUS" && mkdir -p "$STATUS"
: >"$SUMMARY"
T0=$SECONDS
IDX=0
BG_PIDS=()

where=""
[[ $MODE == gpu ]] && where=" (module $([[ $INPLACE == 1 ]] && echo "into python/" || echo "staged in $BUILD/py"))"
echo "gpu_check: mode $MODE$where, python $PY, build $BUILD, out $OUT, budget ${BUDGET}s" \
  "(no step starts after ${SKIP_AFTER}s)"

# ---- step machinery ------------------------------------------------------------------------------
elapsed() { echo $((SECONDS - T0)); }

# record STATUS NAME SECONDS REASON (the index is the step's own)
record() {
  local idx=$1 st=$2 name=$3 secs=$4 reason=$5
  local line
  line=$(printf '%-4s  %-30s %4ss  %s' "$st" "$name" "$secs" "$reason")
  echo "$line" >"$STATUS/$(printf %03d "$idx")"
  echo "$line" >>"$SUMMARY"
  echo "[$(elapsed)s] $line"
}

wanted() {  # wanted NAME: BRAID_GPU_STEPS selects steps by substring (the setup steps always run)
  [[ -z $ONLY ]] && return 0
  case $1 in env|gtest|build|import) return 0 ;; esac
  local w
  for w in ${ONLY//,/ }; do [[ $1 == *"$w"* ]] && return 0; done
  return 1
}

# The reason of a finished step: a line "REASON: ..." or "SKIP: ..." in its log (the last one),
# else pytest's or gtest's summary line, else the log's last line.
pytest_summary() {  # pytest's last line: "3 failed, 13 passed in 45.2s" (with or without ===)
  grep -aE '^(=+ )?([0-9]+ (passed|failed|errors?|skipped|deselected|xfailed|xpassed|warnings?)(, )?)+ in [0-9.]+s|no tests ran' "$1" |
    tail -1 | sed -E 's/^=+ //; s/ =+$//'
}

reason_of() {
  local log=$1 r
  r=$(grep -aE '^(REASON|SKIP): ' "$log" | tail -1 | sed -E 's/^(REASON|SKIP): //')
  [[ -z $r ]] && r=$(pytest_summary "$log")
  [[ -z $r ]] && r=$(tail -n 1 "$log" 2>/dev/null)
  echo "${r:0:300}"
}

# step NAME LIMIT FUNCTION [ARGS...]: runs FUNCTION in a fresh bash under `timeout`, logging to
# OUT/NN-NAME.log. Exit 0 PASS, 77 SKIP, 124/137 FAIL (timeout), anything else FAIL.
step() {
  local name=$1 limit=$2 fn=$3; shift 3
  IDX=$((IDX + 1))
  local idx=$IDX now
  now=$(elapsed)
  if ! wanted "$name"; then
    record "$idx" SKIP "$name" 0 "not selected (BRAID_GPU_STEPS=$ONLY)"; return 77
  fi
  if ((now >= SKIP_AFTER)); then
    record "$idx" SKIP "$name" 0 "global budget: ${now}s elapsed, no step starts after ${SKIP_AFTER}s"
    return 77
  fi
  local left=$((BUDGET - now))
  ((limit > left)) && limit=$left
  local log; log="$OUT/$(printf %02d "$idx")-$name.log"
  echo "[${now}s] >>> $name (limit ${limit}s, log $(basename "$log"))"
  local t=$SECONDS rc
  local preload=()
  # Python steps get native frames on a crash (tools/native_backtrace.c; s_build makes it).
  if [[ -f $BUILD/native_bt.so && $name =~ ^(import|py-|smoke|bench|examples) ]]; then
    preload=(env "LD_PRELOAD=$BUILD/native_bt.so${LD_PRELOAD:+:$LD_PRELOAD}")
  fi
  timeout -k 5 "$limit" "${preload[@]}" bash -c '"$@"' bash "$fn" "$@" >"$log" 2>&1 </dev/null
  rc=$?
  ((${#preload[@]})) && decode_frames "$log"
  local secs=$((SECONDS - t)) reason
  reason=$(reason_of "$log")
  case $rc in
    0) record "$idx" PASS "$name" "$secs" "$reason" ;;
    77) record "$idx" SKIP "$name" "$secs" "$reason" ;;
    124|137) record "$idx" FAIL "$name" "$secs" "timed out after ${limit}s; last: $reason" ;;
    *) record "$idx" FAIL "$name" "$secs" "exit $rc: $reason" ;;
  esac
  return $rc
}

# decode_frames LOG: appends addr2line's function and line for the frames native_backtrace.c
# printed in LOG that fall in braid's own objects (hidden symbols show only as "+0x...").
decode_frames() {
  grep -q 'braid native backtrace:' "$1" || return 0
  command -v addr2line >/dev/null || return 0
  {
    echo "== native frames in braid's objects (addr2line)"
    grep -oE '/[^ (]*(_C[^ (]*\.so|libbraid[^ (]*\.so)\(\+0x[0-9a-f]+\)' "$1" | sort -u | head -40 |
      while IFS= read -r frame; do
        local file=${frame%%(*} off=${frame##*(+}
        echo "$frame: $(addr2line -f -C -e "$file" "${off%)}" 2>/dev/null | tr '\n' ' ')"
      done
  } >>"$1"
}

# step_bg: the same in the background (CPU-only steps that can overlap the GPU steps).
step_bg() {
  step "$@" &
  BG_PIDS+=($!)
  IDX=$((IDX + 1))  # the child took this index; keep the parent's numbering in step
}

wait_bg() {
  local p
  for p in "${BG_PIDS[@]}"; do wait "$p"; done
  BG_PIDS=()
}

skip() {  # skip NAME REASON: a step that cannot run here
  IDX=$((IDX + 1))
  record "$IDX" SKIP "$1" 0 "$2"
}

# ---- step bodies (run in a fresh bash: only exported variables and functions) -------------------
have_pytest() {  # prints how to run pytest, or nothing
  if "$PY" -m pytest --version >/dev/null 2>&1; then echo system
  elif [[ -d $KIT/py/_pytest ]] && PYTHONPATH="$KIT/py:$PYTHONPATH" "$PY" -m pytest --version \
      >/dev/null 2>&1; then echo kit
  fi
}

run_pytest() {  # run_pytest ARGS...: pytest with the machine's or the kit's copy, else skip
  local how; how=$(have_pytest)
  case $how in
    system) "$PY" -m pytest -p no:cacheprovider -o console_output_style=classic "$@" ;;
    kit) PYTHONPATH="$KIT/py:$PYTHONPATH" "$PY" -m pytest -p no:cacheprovider \
           -o console_output_style=classic "$@" ;;
    *) echo "SKIP: pytest is not installed for $PY and there is no kit ($KIT/py): run" \
         "tools/gpu_check.sh --prepare-kit and carry build/gpu-kit"; return 77 ;;
  esac
}

gtest_prefix() {  # where GoogleTest is installed: the system (empty), the kit's build, or none
  if compgen -G "/usr/lib*/libgtest*" >/dev/null || compgen -G "/usr/lib/*/libgtest*" >/dev/null ||
     compgen -G "/usr/local/lib*/libgtest*" >/dev/null; then echo system
  elif [[ -f $BUILD/gtest/install/include/gtest/gtest.h ]]; then echo "$BUILD/gtest/install"
  fi
}

torch_libdirs() {  # torch's lib, the CUDA toolkit's and the pip nvidia wheels' (for dlopen)
  "$PY" - <<'EOF' 2>/dev/null
import glob, os
try:
    import torch
    site = os.path.dirname(os.path.dirname(torch.__file__))
    dirs = [os.path.join(os.path.dirname(torch.__file__), "lib")]
    dirs += sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib")))
except Exception:
    dirs = []
dirs.append(os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "lib64"))
print(":".join(d for d in dirs if os.path.isdir(d)))
EOF
}

s_env() {
  echo "== host: $(uname -srm), $(nproc) cores, $(free -g 2>/dev/null | awk '/Mem:/ {print $2 " GiB"}')"
  echo "== nvidia-smi -L"; nvidia-smi -L 2>&1
  nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv 2>&1
  echo "== nvcc"; nvcc --version 2>&1 | tail -2
  echo "== tools"
  local t
  for t in cmake g++ ninja ccache compute-sanitizer gdb; do
    printf '%-18s %s\n' "$t" "$(command -v "$t" || echo '-') $("$t" --version 2>/dev/null | head -1)"
  done
  echo "pytest             $(have_pytest || true) $("$PY" -m pytest --version 2>&1 | head -1)"
  echo "googletest         $(gtest_prefix || true) (kit: $([[ -d $KIT/googletest ]] && echo yes || echo no))"
  echo "== python"
  "$PY" - <<'EOF'
import os, sys
print("python", sys.version.split()[0], sys.executable)
import torch
cuda = torch.version.cuda
nccl = "-"
try:
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if cuda else "-"
except Exception as e:
    nccl = f"({e!r})"
avail = torch.cuda.is_available()
n = torch.cuda.device_count() if avail else 0
names = [torch.cuda.get_device_name(i) for i in range(n)]
print("torch", torch.__version__, "cuda", cuda, "nccl", nccl, "available", avail, "devices", names)
mode = os.environ.get("MODE")
gpus = f"{n} x {names[0]}" if names else "no GPU"
print(f"REASON: torch {torch.__version__}, CUDA {cuda}, NCCL {nccl}, {gpus}")
if mode == "gpu" and not avail:
    seen = "nvidia-smi lists a GPU" if os.environ.get("GPU_SEEN") == "1" else "mode forced"
    print(f"REASON: GPU mode ({seen}) but torch.cuda.is_available() is False")
    sys.exit(1)
EOF
}

s_syntax() {
  bash -n "$repo/tools/gpu_check.sh" || return 1
  # compile() rather than py_compile: nothing written beside the sources
  "$PY" -c 'import sys; [compile(open(f).read(), f, "exec") for f in sys.argv[1:]]' \
    "$repo/tools/gpu_smoke.py" "$repo/benchmarks/collectives.py" \
    "$repo/benchmarks/ddp.py" "$repo/benchmarks/_bench_common.py" \
    "$repo/benchmarks/scaling.py" || return 1
  "$PY" "$repo/benchmarks/collectives.py" --device cuda --quick --help >/dev/null || return 1
  "$PY" "$repo/tools/gpu_smoke.py" --help >/dev/null || return 1
  bash -n "$repo/tools/scaling_check.sh" || return 1
  "$PY" "$repo/benchmarks/scaling.py" --help >/dev/null || return 1
  "$repo/tools/scaling_check.sh" --help >/dev/null || return 1
  echo "REASON: bash -n, compile() and --help of gpu_check.sh, gpu_smoke.py, collectives.py," \
    "ddp.py, scaling.py, scaling_check.sh"
}

s_gtest() {
  local src=$KIT/googletest
  [[ -f $src/CMakeLists.txt ]] || { echo "SKIP: no GoogleTest here or in the kit ($src)"; return 77; }
  local gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S "$src" -B "$BUILD/gtest/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$BUILD/gtest/install" -DBUILD_GMOCK=ON -DINSTALL_GTEST=ON \
    -DCMAKE_POSITION_INDEPENDENT_CODE=ON || return 1
  cmake --build "$BUILD/gtest/build" -j "$JOBS" && cmake --install "$BUILD/gtest/build" >/dev/null ||
    return 1
  echo "REASON: GoogleTest from the kit installed in $BUILD/gtest/install"
}

s_build() {
  local torch_prefix gen=() kernels=OFF prefix gt
  torch_prefix=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)') || return 1
  command -v ninja >/dev/null && gen=(-G Ninja)
  command -v nvcc >/dev/null && kernels=ON
  # Note [One libstdc++ per process] (cmake/SharedLibstdcxx.cmake): the H100 run built _C with
  # /opt/gcc/bin/g++ and every group's construction crashed inside libstdc++ code linked into
  # _C. The system's g++, whose libstdc++ is the shared one the process loads, goes first.
  local cxx=${CXX:-}
  [[ -z $cxx && -x /usr/bin/g++ ]] && cxx=/usr/bin/g++
  [[ -n $cxx ]] && gen+=(-DCMAKE_CXX_COMPILER="$cxx")
  echo "== C++ compiler: ${cxx:-the default} (libstdc++: $(${cxx:-g++} -print-file-name=libstdc++.so 2>&1))"
  prefix=$torch_prefix
  gt=$(gtest_prefix)
  [[ -n $gt && $gt != system ]] && prefix="$prefix;$gt"
  local arch
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' ')
  export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-${arch:-9.0}}
  export CUDACXX=${CUDACXX:-$CUDA_HOME/bin/nvcc} CUDAToolkit_ROOT=$CUDA_HOME
  export CCACHE_DIR=${CCACHE_DIR:-$BUILD/ccache}
  local t=$SECONDS
  echo "== configure (kernels $kernels, TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST)"
  # -g1: line tables, so that decode_frames can name a crashing function (same code as Release).
  cmake -S "$repo" -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DBRAID_BUILD_PYTHON=ON \
    -DCMAKE_CXX_FLAGS_RELEASE="-O3 -DNDEBUG -g1" \
    -DBRAID_BUILD_TESTS=ON -DBRAID_CUDA_KERNELS=$kernels -DPython3_EXECUTABLE="$PY" \
    -DCMAKE_PREFIX_PATH="$prefix" || { echo "REASON: cmake configure failed"; return 1; }
  echo "== configured in $((SECONDS - t)) s; building _C with -j$JOBS"
  local so="" failed=""
  if cmake --build "$BUILD" -j "$JOBS" --target _C; then
    so=$(ls "$BUILD"/_C*.so 2>/dev/null | head -1)
  fi
  local dest=$repo/python/torch_braid
  [[ $INPLACE == 1 ]] || dest=$BUILD/py/torch_braid
  mkdir -p "$dest"
  [[ $INPLACE == 1 ]] || cp -f "$repo"/python/torch_braid/*.py "$dest/"
  rm -f "$dest"/_C.cpython-"$("$PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')"*.so
  if [[ -n $so ]]; then
    # The tests import torch_braid from python/ (harness.PYTHON_DIR): on the GPU machine the
    # module goes there (the checkout is a copy; *.so is ignored by git), elsewhere into
    # $BUILD/py, ahead of python/ on PYTHONPATH (Note [Where the module goes]).
    cp -f "$so" "$dest/" || return 1
    echo "== _C built in $((SECONDS - t)) s: $(basename "$so") -> $dest"
  else
    failed="building _C failed"
    echo "== building _C failed; the C++ tests (torch-free) are built all the same"
  fi
  local targets=() tgt
  # The targets are named after tests/cpp/test_cuda_*.cc (CMakeLists.txt); ninja's target list
  # also holds gtest_discover_tests' helper targets (test_cuda_X_<hash>_tests), not buildable.
  if [[ -n $gt ]]; then
    for tgt in tests/cpp/test_cuda_*.cc; do
      [[ -f $tgt ]] && tgt=${tgt##*/} && targets+=("${tgt%.cc}")
    done
  fi
  local note=""
  if ((${#targets[@]} == 0)); then
    if [[ -z $gt ]]; then note="; C++ tests not configured: no GoogleTest"
    else note="; no test_cuda* targets"; fi
  else
    local keep=(-- -k); [[ ${#gen[@]} -gt 0 ]] && keep=(-- -k 0)
    echo "== building ${targets[*]}"
    cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}" "${keep[@]}" ||
      note="; building some C++ tests failed"
    local built=0
    for tgt in "${targets[@]}"; do [[ -x $BUILD/$tgt ]] && built=$((built + 1)); done
    note="$note; C++ tests built: $built of ${#targets[@]}"
  fi
  local cc; cc=$(ccache -s 2>/dev/null | grep -m1 -iE 'hits' | tr -s ' ')
  # Native frames for the Python steps' crashes (decode_frames).
  cc -shared -fPIC -O1 -o "$BUILD/native_bt.so" "$repo/tools/native_backtrace.c" ||
    echo "== no native backtraces: tools/native_backtrace.c did not compile"
  echo "REASON: ${failed:-_C built} (kernels=$kernels) in $((SECONDS - t)) s (${cc:-no ccache})$note"
  [[ -n $failed || $note == *failed* ]] && return 1
  return 0
}

s_import() {
  "$PY" -c 'import torch_braid, torch; print("torch_braid", torch_braid.__version__, "from",
    torch_braid.__file__); print(torch_braid.build_info())' || { echo "REASON: import torch_braid failed"; return 1; }
  "$PY" -m torch_braid.info || { echo "REASON: python -m torch_braid.info failed"; return 1; }
  local cuda
  # The build block (up to the first blank line): its CUDA, NCCL and kernel lines.
  cuda=$("$PY" -m torch_braid.info 2>/dev/null | sed '/^$/q' | grep -iE 'cuda|nccl|kernel' |
    sed -E 's/^ +//; s/  +/ /g' | tr '\n' ';')
  echo "REASON: imports; info: ${cuda:-no CUDA line}"
}

# run_pytest_split N TAG ARGS...: the tests ARGS select, dealt round-robin to N pytest processes
# at once (each case of test_error_exit.py spawns its own 2 ranks, and pays torch's import:
# one after another they would take minutes). Prints each part's output, then one summary line.
run_pytest_split() {
  local n=$1 tag=$2; shift 2
  local dir=$OUT/$tag.parts
  rm -rf "$dir"; mkdir -p "$dir"
  run_pytest --collect-only -q "$@" >"$dir/collect" 2>&1
  local rc=$?
  ((rc == 77)) && { cat "$dir/collect"; return 77; }
  mapfile -t ids < <(grep '::' "$dir/collect")
  if ((${#ids[@]} == 0)); then
    cat "$dir/collect"; echo "REASON: no tests collected"; return 1
  fi
  local i pids=()
  for ((i = 0; i < n; i++)); do
    local part=()
    local j
    for ((j = i; j < ${#ids[@]}; j += n)); do part+=("${ids[j]}"); done
    ((${#part[@]})) || continue
    run_pytest -q -rfE "${part[@]}" >"$dir/part$i.log" 2>&1 &
    pids+=($!)
  done
  rc=0
  for i in "${pids[@]}"; do wait "$i" || rc=1; done
  local p f s e
  p=0 f=0 s=0 e=0
  for i in "$dir"/part*.log; do
    echo "==== $(basename "$i")"; cat "$i"
    local line; line=$(pytest_summary "$i")
    [[ $line =~ ([0-9]+)\ passed ]] && p=$((p + BASH_REMATCH[1]))
    [[ $line =~ ([0-9]+)\ failed ]] && f=$((f + BASH_REMATCH[1]))
    [[ $line =~ ([0-9]+)\ skipped ]] && s=$((s + BASH_REMATCH[1]))
    [[ $line =~ ([0-9]+)\ error ]] && e=$((e + BASH_REMATCH[1]))
  done
  echo "SUMMARY: $p passed, $f failed, $s skipped, $e errors (${#ids[@]} tests in ${#pids[@]} pytest processes)"
  return $rc
}

s_py_errors() {
  cd "$repo" || return 1  # pytest's node ids are relative to the repository root
  local out rc
  out=$(run_pytest_split 4 py-errors tests/python/test_error_exit.py); rc=$?
  echo "$out"
  ((rc == 77)) && return 77
  local segv; segv=$(grep -oE '[a-z_]+: rank [0-9]+ killed by SIGSEGV' <<<"$out" | sort -u | wc -l)
  local summary; summary=$(grep '^SUMMARY: ' <<<"$out" | tail -1)
  echo "REASON: ${summary#SUMMARY: }; rank exits by SIGSEGV reported: $segv"
  return $rc
}

s_py_fast() {
  cd "$repo/tests/python" || return 1
  # Pooled-world suites that take seconds each on 16 cores (forkserver starts worlds fast).
  local out rc t=tests/python
  out=$(cd "$repo" && BRAID_TEST_START_METHOD=forkserver run_pytest_split 3 py-fast -m "not slow" \
    $t/test_info.py $t/test_collectives_allreduce.py $t/test_collectives_async.py \
    $t/test_coalescing.py $t/test_subgroups.py)
  rc=$?
  echo "$out"
  ((rc == 77)) && return 77
  echo "REASON: $(grep '^SUMMARY: ' <<<"$out" | tail -1 | sed 's/^SUMMARY: //')"
  return $rc
}

s_smoke() {  # s_smoke WORLD LIMIT
  "$PY" "$repo/tools/gpu_smoke.py" --world "$1" --large --timeout $(($2 - 10)) \
    --json "$OUT/smoke-w$1.json"
  local rc=$?
  local line; line=$(grep -E '^gpu_smoke: (PASS|FAIL|SKIP)' "$OUT"/*-smoke-w"$1".log | tail -1)
  line=${line#gpu_smoke: }
  [[ -n $line ]] && echo "REASON: ${line#SKIP: }"
  ((rc == 77)) && return 77
  return $rc
}

gtest_counts() {  # the pass/fail/skip counts of a gtest log
  local log=$1 p f s
  p=$(grep -aoE '^\[  PASSED  \] [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+$')
  f=$(grep -aoE '^\[  FAILED  \] [0-9]+ test' "$log" | tail -1 | grep -oE '[0-9]+')
  s=$(grep -aoE '^\[  SKIPPED \] [0-9]+ test' "$log" | tail -1 | grep -oE '[0-9]+')
  local names; names=$(grep -aE '^\[  FAILED  \] [A-Za-z_]' "$log" | sed -E 's/^\[  FAILED  \] //; s/ \(.*//' |
    sort -u | head -4 | tr '\n' ' ')
  echo "${p:-0} passed, ${f:-0} failed, ${s:-0} skipped${names:+ (failed: ${names% })}"
}

s_cpp() {  # s_cpp BINARY
  export LD_LIBRARY_PATH; LD_LIBRARY_PATH="$(torch_libdirs)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local name; name=$(basename "$1")
  BRAID_EXPECT_GPU=$GPU_SEEN BRAID_TEST_REAL_CUDA=1 "$1" --gtest_output="xml:$OUT/$name.xml"
  local rc=$?
  echo "REASON: $(gtest_counts "$(ls "$OUT"/*-cpp-"$name".log | tail -1)")"
  return $rc
}

s_sanitize() {  # s_sanitize TOOL BINARY
  command -v compute-sanitizer >/dev/null || { echo "SKIP: compute-sanitizer not found"; return 77; }
  export LD_LIBRARY_PATH; LD_LIBRARY_PATH="$(torch_libdirs)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local name; name=$(basename "$2")
  BRAID_EXPECT_GPU=$GPU_SEEN BRAID_TEST_REAL_CUDA=1 compute-sanitizer --tool "$1" --error-exitcode 66 \
    "$2" --gtest_filter="${BRAID_GPU_SANITIZE_FILTER:-*}"
  local rc=$? log; log=$(ls "$OUT"/*-"$1"-"$name".log | tail -1)
  local errs; errs=$(grep -aE '========= (ERROR SUMMARY|RACECHECK SUMMARY)' "$log" | tail -1 |
    sed 's/=* //')
  echo "REASON: ${errs:-no sanitizer summary}; $(gtest_counts "$log")"
  return $rc
}

s_py_cuda() {  # s_py_cuda FILE
  cd "$repo" || return 1
  BRAID_EXPECT_GPU=$GPU_SEEN BRAID_TEST_REAL_CUDA=1 BRAID_TEST_START_METHOD=forkserver \
    run_pytest -q -rfs "tests/python/$1"
}

s_examples() {
  local with=() without=() f
  for f in "$repo"/examples/*.py; do
    if grep -qE 'BRAID_EXAMPLE_DEVICE|--device' "$f"; then with+=("$f"); else without+=("$(basename "$f")"); fi
  done
  if ((${#with[@]} == 0)); then
    echo "SKIP: no example takes a device option (BRAID_EXAMPLE_DEVICE or --device): ${without[*]}"
    return 77
  fi
  local rc=0 ok=()
  for f in "${with[@]}"; do
    echo "== $(basename "$f")"
    local extra=(); grep -q -- '--device' "$f" && extra=(--device cuda)
    BRAID_EXAMPLE_DEVICE=cuda BRAID_EXAMPLE_BACKEND=braid timeout 50 "$PY" -m torch.distributed.run \
      --standalone --nproc_per_node=2 "$f" "${extra[@]}" || rc=1
    ok+=("$(basename "$f")")
  done
  echo "REASON: ran ${ok[*]} on cuda; no device option: ${without[*]:-none}"
  return $rc
}

s_bench_coll() {  # s_bench_coll NPROCS
  "$PY" "$repo/benchmarks/collectives.py" --nprocs "$1" --device cuda --quick --no-progress \
    --json "$OUT/bench-coll-w$1.json"
  local rc=$? log; log=$(ls "$OUT"/*-bench-coll-w"$1".log | tail -1)
  "$PY" - "$OUT/bench-coll-w$1.json" "$log" <<'EOF'
import json, sys
try:
    run = json.load(open(sys.argv[1]))["runs"][0]
except Exception as e:
    said = [l.strip() for l in open(sys.argv[2], errors="replace") if l.startswith("bench: ")]
    print(f"REASON: no results: {said[-1] if said else repr(e)}")
    sys.exit(0)
cells = {}
for r in run["results"]:
    cells.setdefault((r["op"], r["requested_bytes"]), {})[r["backend_name"]] = r
parts = []
for (op, size), c in sorted(cells.items()):
    b = c.get("braid")
    ok = bool(b and b["status"] == "ok")
    txt = f"{op} {size}B braid " + (f"{b['time_us']:.0f}us" if ok else "n/a")
    for o in ("gloo", "nccl"):
        x = c.get(o)
        if ok and x and x["status"] == "ok":
            txt += f", {o} {x['time_us']:.0f}us ({x['time_us'] / b['time_us']:.2f}x)"
    parts.append(txt)
t = run.get("targets", [])
met = sum(1 for c in t if c["met"])
miss = sum(1 for c in t if c["met"] is False)
print(f"REASON: targets met {met}, NOT met {miss}, n/a {len(t) - met - miss}; " + "; ".join(parts))
EOF
  return $rc
}

s_bench_ddp() {
  "$PY" "$repo/benchmarks/ddp.py" --device cuda --quick --quiet --json "$OUT/bench-ddp.json"
  local rc=$? log; log=$(ls "$OUT"/*-bench-ddp.log | tail -1)
  local t; t=$(grep -E 'PyTorch DDP on braid vs on gloo' "$log" | tail -1 | sed 's/^ *//')
  echo "REASON: ${t:-no target line}"
  return $rc
}

s_scaling() {  # s_scaling LIMIT: issue 30's sweep, fitted into LIMIT less 20 s
  BRAID_PYTHON=$PY BRAID_SCALING_BUDGET_S=$(($1 - 20)) "$repo/tools/scaling_check.sh" "$OUT/scaling"
}

s_globs() {
  local py=() cc=()
  mapfile -t py < <(ls "$repo"/tests/python/test_cuda*.py 2>/dev/null)
  mapfile -t cc < <(ls "$repo"/tests/cpp/test_cuda*.cc 2>/dev/null)
  echo "tests/python/test_cuda*.py: ${py[*]:-none}"
  echo "tests/cpp/test_cuda*.cc: ${cc[*]:-none}"
  local rc=0 how="not collected: torch_braid does not import (conftest needs it)"
  if ((${#py[@]})) && [[ ${MODULE:-0} == 1 ]]; then
    (cd "$repo/tests/python" && run_pytest --collect-only -q "${py[@]}"); rc=$?
    how="pytest --collect-only exit $rc"
    ((rc == 77)) && { how="not collected: no pytest"; rc=0; }
  fi
  echo "REASON: ${#py[@]} Python and ${#cc[@]} C++ CUDA test files; $how"
  return $rc
}

s_smoke_dry() {
  "$PY" "$repo/tools/gpu_smoke.py" --dry-run || return 1
  "$PY" "$repo/tools/gpu_smoke.py" --dry-run --device cpu --world 1,2,4 || return 1
  echo "REASON: gpu_smoke.py --dry-run (cuda and cpu) plans and imports"
}

s_smoke_cpu() {
  "$PY" "$repo/tools/gpu_smoke.py" --device cpu --world 2 --ddp-steps 3 --timeout 50
  local rc=$?
  local line; line=$(grep -E '^gpu_smoke: (PASS|FAIL)' "$OUT"/*-smoke-cpu.log | tail -1)
  echo "REASON: ${line#gpu_smoke: }"
  return $rc
}

s_bench_nocuda() {  # without CUDA, --device cuda must say so and exit 2 without spawning ranks
  local b out rc
  for b in collectives ddp; do
    out=$("$PY" "$repo/benchmarks/$b.py" --device cuda --quick 2>&1); rc=$?
    echo "$b.py --device cuda: exit $rc: $out"
    [[ $rc == 2 && $out == *"--device cuda:"*CUDA* ]] || { echo "REASON: $b.py: no clear message"; return 1; }
  done
  echo "REASON: collectives.py and ddp.py --device cuda exit 2 with the reason"
}

export -f have_pytest run_pytest run_pytest_split pytest_summary gtest_prefix torch_libdirs gtest_counts s_env s_syntax s_gtest \
  s_build s_import s_py_errors s_py_fast s_smoke s_cpp s_sanitize s_py_cuda s_examples \
  s_bench_coll s_bench_ddp s_scaling s_globs s_smoke_dry s_smoke_cpu s_bench_nocuda

# ---- the run -------------------------------------------------------------------------------------
step env 30 s_env
if [[ $MODE == gpu ]]; then
  gt=$(gtest_prefix)
  if [[ $gt == system ]]; then skip gtest "the machine has GoogleTest"
  elif ! compgen -G "tests/cpp/test_cuda*.cc" >/dev/null; then skip gtest "no tests/cpp/test_cuda*.cc"
  else step gtest 60 s_gtest; fi
  step build "${BRAID_GPU_BUILD_LIMIT_S:-270}" s_build
  build_ok=$?
  if [[ $build_ok == 0 || $build_ok == 77 ]] && step import 60 s_import; then module=1; else module=0; fi
  # Python test files on the simulated device run on the CPU: in the background with the
  # CPU-only suites. The others drive the GPU: in the foreground, one at a time.
  pyc=() pysim=()
  for f in tests/python/test_cuda*.py; do
    [[ -e $f ]] || continue
    if [[ $(basename "$f") == *sim* ]]; then pysim+=("$(basename "$f")"); else pyc+=("$(basename "$f")"); fi
  done
  if ((module)); then
    step_bg py-errors 150 s_py_errors
    step_bg py-fast 120 s_py_fast
    for f in "${pysim[@]}"; do step_bg "py-${f%.py}" 150 s_py_cuda "$f"; done
  else
    for s in py-errors py-fast; do skip $s "torch_braid was not built or does not import"; done
  fi
  bins=()
  for b in "$BUILD"/test_cuda*; do [[ -x $b && -f $b ]] && bins+=("$b"); done
  if ((${#bins[@]} == 0)); then
    skip cpp "no test_cuda* binaries in $BUILD (see the build step's reason)"
  else
    for b in "${bins[@]}"; do step "cpp-$(basename "$b")" 90 s_cpp "$b"; done
  fi
  # compute-sanitizer over the binaries that drive the real device (the simulated ones make no
  # CUDA call to check): one after another, in the background, beside the smoke worlds.
  san=()
  for b in "${bins[@]}"; do [[ $(basename "$b") =~ kernel|runtime|real ]] && san+=("memcheck:$b"); done
  for b in "${bins[@]}"; do [[ $(basename "$b") =~ kernel ]] && san+=("racecheck:$b"); done
  if ((${#san[@]} == 0)); then
    skip sanitizer "no test_cuda*{kernel,runtime,real}* binary built"
  else
    (for x in "${san[@]}"; do
       step "${x%%:*}-$(basename "${x#*:}")" 120 s_sanitize "${x%%:*}" "${x#*:}"
     done) &
    BG_PIDS+=($!)
    IDX=$((IDX + ${#san[@]}))
  fi
  if ((module)); then
    # With one GPU, 2, 4 and 8 ranks share it: braid's same-GPU collectives (issue 29).
    for w in 1 2 4 8; do lim=$((w >= 4 ? 100 : 90)); step "smoke-w$w" $lim s_smoke $w $lim; done
  else
    for s in smoke-w1 smoke-w2 smoke-w4 smoke-w8; do
      skip $s "torch_braid was not built or does not import"
    done
  fi
  if ((${#pyc[@]} + ${#pysim[@]} == 0)); then skip py-cuda "no tests/python/test_cuda*.py"
  elif ((module)); then
    for f in "${pyc[@]}"; do step "py-${f%.py}" 120 s_py_cuda "$f"; done
  else skip py-cuda "torch_braid was not built or does not import"; fi
  wait_bg  # the benchmarks run on a quiet machine
  if ((module)); then
    step bench-coll-w2 75 s_bench_coll 2
    step bench-coll-w4 90 s_bench_coll 4
    step bench-coll-w8 90 s_bench_coll 8
    step bench-coll-w1 60 s_bench_coll 1
    step bench-ddp 90 s_bench_ddp
  else
    skip bench "torch_braid was not built or does not import"
  fi
  if ((module)); then step examples 60 s_examples; else skip examples "torch_braid does not import"; fi
  # Issue 30's scaling sweep (CPU tensors, the 16 cores): last, in what is left of the budget.
  left=$((BUDGET - $(elapsed))) lim=240
  ((left < lim)) && lim=$left
  if ! ((module)); then skip bench-scaling "torch_braid does not import"
  elif ((lim < 60)) && wanted bench-scaling; then
    why="global budget: ${left}s left, the sweep needs 60 s or more"
    skip bench-scaling "$why (BRAID_GPU_STEPS=scaling runs it alone)"
  else step bench-scaling $lim s_scaling $lim; fi
else
  step syntax 30 s_syntax
  if why=$("$PY" -c 'import torch_braid' 2>&1); then
    skip build "no GPU: the in-place module imports (tools/setup.sh built it)"
    module=1
  else
    skip build "no GPU, and the in-place module does not import (run tools/setup.sh; a build here takes minutes): $(echo "$why" | tail -1)"
    module=0
  fi
  export MODULE=$module
  if ((module)); then step import 30 s_import; else skip import "torch_braid is not built"; fi
  step globs 40 s_globs
  if ((module)); then
    step smoke-dry 30 s_smoke_dry
    step smoke-cpu 60 s_smoke_cpu
  else
    skip smoke-dry "torch_braid is not built"
    skip smoke-cpu "torch_braid is not built"
  fi
  step bench-nocuda 40 s_bench_nocuda
  for s in gtest cpp-test_cuda* py-errors py-fast smoke-w1,2,4,8 py-test_cuda* bench-coll \
      bench-ddp memcheck racecheck examples bench-scaling; do
    skip "$s" "no CUDA device (nvidia-smi lists no GPU)"
  done
fi
wait_bg

# The summary in step order (background steps finished out of order).
cat "$STATUS"/* >"$SUMMARY" 2>/dev/null
rm -rf "$STATUS"
total=$(elapsed)
fails=$(grep -c '^FAIL' "$SUMMARY")
passes=$(grep -c '^PASS' "$SUMMARY")
skips=$(grep -c '^SKIP' "$SUMMARY")
echo "gpu_check: $passes passed, $fails failed, $skips skipped in ${total}s (mode $MODE)" | tee -a "$SUMMARY"
echo "---- $SUMMARY"
cat "$SUMMARY"
((fails == 0))
