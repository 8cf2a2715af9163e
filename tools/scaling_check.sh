#!/usr/bin/env bash
# Issue 30's scaling sweep (benchmarks/scaling.py) into OUTDIR, fitted into a time budget.
#
#   tools/scaling_check.sh OUTDIR           # the full sweep: under 4 minutes on 16 cores
#   tools/scaling_check.sh OUTDIR --quick   # 2, 4 and 8 ranks, allreduce and allgather at 4 B,
#                                           # 64 KiB and 16 MiB, co-resident at 4: about a
#                                           # minute on 2 cores
#   tools/scaling_check.sh --help
#
# The full sweep: 2, 4, 8, 12, 16 and 32 ranks (those above the CPU count run oversubscribed and
# are labelled so) for allreduce, broadcast, allgather and reduce_scatter at 4 B, 64 KiB, 16 MiB
# and 64 MiB, each backend (braid, gloo) alone in its own set of processes, plus braid and gloo
# co-resident in the same processes at 8 ranks; repeated twice while the budget allows
# (scaling.py's Note [Budget]: a short budget drops the second repeat first, then the largest
# world sizes, each listed as "not measured (budget)").
#
# Writes OUTDIR/scaling.txt (the tables and issue 30's targets), OUTDIR/scaling.json,
# OUTDIR/scaling.png and OUTDIR/scaling-logs/ (each collectives.py job's output), and ends with a
# line "REASON: ..." (tools/gpu_check.sh shows it). Exits 0 when the sweep ran, whatever the
# targets say (they are printed as met / NOT met / n/a); non-zero only when the benchmark fails:
# 3 for a job's wrong result, crash or hang, 2 for bad usage.
#
# Environment: BRAID_PYTHON (default /opt/torch/.venv/bin/python3 if present, else
# /usr/bin/python3); BRAID_SCALING_BUDGET_S (seconds for the whole sweep, default 230, --quick
# 120; gpu_check.sh passes what its step may take); BRAID_SCALING_PIN=1 pins rank r to CPU
# r % ncpus (scaling.py --pin); BRAID_SCALING_NPROCS, BRAID_SCALING_OPS, BRAID_SCALING_SIZES,
# BRAID_SCALING_REPEATS, BRAID_SCALING_CORESIDENT override the sweep.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd -P)

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
case ${1:-} in
  -h|--help) usage; exit 0 ;;
  ''|-*) usage >&2; exit 2 ;;
esac
OUT=$1; shift
quick=0
for a in "$@"; do
  case $a in
    --quick) quick=1 ;;
    *) echo "scaling_check: unknown option $a" >&2; exit 2 ;;
  esac
done

if [[ -n ${BRAID_PYTHON:-} ]]; then PY=$BRAID_PYTHON
elif [[ -x /opt/torch/.venv/bin/python3 ]]; then PY=/opt/torch/.venv/bin/python3
else PY=/usr/bin/python3; fi

if ((quick)); then
  nprocs=2,4,8 ops=allreduce,allgather sizes=4,64K,16M repeats=1 co=4 budget=120
else
  nprocs=2,4,8,12,16,32 ops=allreduce,broadcast,allgather,reduce_scatter sizes=4,64K,16M,64M
  repeats=2 co=8 budget=230
fi
nprocs=${BRAID_SCALING_NPROCS:-$nprocs}
ops=${BRAID_SCALING_OPS:-$ops}
sizes=${BRAID_SCALING_SIZES:-$sizes}
repeats=${BRAID_SCALING_REPEATS:-$repeats}
co=${BRAID_SCALING_CORESIDENT:-$co}
budget=${BRAID_SCALING_BUDGET_S:-$budget}
pin=()
[[ ${BRAID_SCALING_PIN:-0} == 1 ]] && pin=(--pin)

mkdir -p "$OUT" || exit 2
cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc obeys OMP_NUM_THREADS
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
echo "scaling_check: $PY, ranks $nprocs, ops $ops, sizes $sizes, repeats $repeats," \
  "co-resident at $co, budget ${budget}s, $cpus CPUs, pinned: ${pin[*]:-no}"
"$PY" "$repo/benchmarks/scaling.py" --nprocs "$nprocs" --ops "$ops" --sizes "$sizes" \
  --repeats "$repeats" --coresident-at "$co" --budget-s "$budget" --time-per-point 0.06 \
  "${pin[@]}" --log-dir "$OUT/scaling-logs" --json "$OUT/scaling.json" \
  --plot "$OUT/scaling.png" --table "$OUT/scaling.txt"
rc=$?
# One line for gpu_check's summary: what ran, and the targets' counts.
"$PY" - "$OUT/scaling.json" "$rc" <<'EOF'
import json, sys
try:
    rep = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"REASON: scaling.py exit {sys.argv[2]}, no JSON: {e!r}")
    sys.exit(0)
jobs = rep["jobs"]
by = {s: sum(1 for j in jobs if j["status"] == s) for s in ("ok", "budget", "failed", "timeout")}
t = rep.get("targets", [])
met = sum(1 for c in t if c["met"])
miss = sum(1 for c in t if c["met"] is False)
ar = {(p["ranks"], p["backend"]): p["time_us"] for p in rep.get("points", [])
      if p["op"] == "allreduce" and p["requested_bytes"] == 4 and p["status"] == "ok"}
lat = ", ".join(f"{n}: {ar[(n, 'braid')]:.0f}/{ar[(n, 'gloo')]:.0f}"
                for n in rep["meta"]["nprocs"] if (n, "braid") in ar and (n, "gloo") in ar)
print(f"REASON: scaling.py exit {sys.argv[2]}: jobs {by['ok']} ok, {by['budget']} not measured "
      f"(budget), {by['failed'] + by['timeout']} failed; targets met {met}, NOT met {miss}, "
      f"n/a {len(t) - met - miss} ({rep['meta']['cpus_usable']} CPUs); 4 B allreduce us "
      f"braid/gloo by ranks: {lat or '-'}")
EOF
exit $rc
