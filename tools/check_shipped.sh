#!/usr/bin/env bash
# Checks that what braid ships holds no test scaffolding (Note [Simulators
# outside the product] in csrc/python/testing_hooks.h):
#   tools/check_shipped.sh PREFIX SITE
# PREFIX: a `cmake --install` prefix (libbraid.so and the headers);
# SITE: the site-packages that `pip install .` filled (torch_braid/).
# Fails, naming each offender, on a simulator symbol in libbraid.so or _C
# (their symbol tables, exported or not), a simulator header or a test file
# installed, or a header outside the public set's includes.
set -euo pipefail
prefix=$1
site=$2
fail=0
# The simulators' names: the device (SimDevice, SimStream, SimEvent,
# SharedEvent, simulatedDevice), NCCL (SimulatedNccl, simnccl::), the torch
# glue (braid::sim::), the same-GPU stand-in for NCCL, and the failure
# injectors (FaultyDevice, FaultyNccl).
pattern='braid::sim::|braid::cuda::(sim|simnccl)::|SimulatedNccl|SimulatedDevice|simulatedDevice|SameGpuAsNccl|sameGpuCollectivesAsNccl|FaultyDevice|FaultyNccl'
shopt -s nullglob
libs=("$prefix"/lib*/libbraid.so "$site"/torch_braid/_C*.so)
((${#libs[@]} == 2)) || { echo "check_shipped: expected libbraid.so and _C, found: ${libs[*]}" >&2; exit 1; }
for lib in "${libs[@]}"; do
  hits=$( { nm -C "$lib" 2>/dev/null; nm -DC "$lib"; } | grep -E "$pattern" | sort -u || true)
  if [[ -n $hits ]]; then
    echo "check_shipped: $lib defines simulator symbols:" >&2
    echo "$hits" | head -20 >&2
    fail=1
  fi
done
bad=$(cd "$prefix" && find . -path '*include/braid*' -name '*.h' | grep -E 'sim|/tests/' || true)
[[ -z $bad ]] || { echo "check_shipped: simulator headers installed: $bad" >&2; fail=1; }
bad=$(cd "$site" && find torch_braid -name '*sim*' -o -name 'braid_sim*' | grep -v __pycache__ || true)
[[ -z $bad ]] || { echo "check_shipped: simulator files in the Python package: $bad" >&2; fail=1; }
[[ ! -e $site/braid_sim ]] || { echo "check_shipped: braid_sim was installed" >&2; fail=1; }
headers=$(cd "$prefix" && find . -path '*include/braid*' -name '*.h' | wc -l)
((fail == 0)) || exit 1
echo "check_shipped: libbraid.so and _C define no simulator symbol; $headers public headers, none a simulator's" >&2
