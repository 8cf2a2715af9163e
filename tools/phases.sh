# Sourced by tests/run_all.sh and tests/run_suite.sh, which print each phase's wall time at
# the end of a run. `phase NAME` closes the running phase under NAME: it appends
# "<phase_prefix>NAME  <seconds> s" to the array `phases`, and to the file $phase_file when
# that is set (run_suite.sh hands its phases to run_all.sh that way, across the roots' chroot).
phases=()
phase_start=$SECONDS
phase() {
  local line
  line=$(printf '%-34s %5d s' "${phase_prefix:-}$1" $((SECONDS - phase_start)))
  phases+=("$line")
  [[ -z "${phase_file:-}" ]] || echo "$line" >>"$phase_file"
  phase_start=$SECONDS
}
