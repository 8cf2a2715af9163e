#!/usr/bin/env bash
# Simulated hosts on this machine (network, UTS and mount namespaces joined by veth to a
# bridge); see Note [Simulated hosts] in tools/hosts.py, which does the work.
#   h=$(tools/hosts.sh create 2 [--link-gbit 1])   # prints the run's prefix
#   tools/hosts.sh run "$h" 1 hostname              # -> braid-h1
#   tools/hosts.sh teardown "$h"                    # exit 1 and a list if anything is left
#   tools/hosts.sh check                            # "ok", or why hosts cannot be made here
exec "${BRAID_PYTHON:-python3}" "$(dirname "$0")/hosts.py" "$@"
