#!/bin/bash
# One device call for the scenario lab (issue 5): the environment, then the lab; everything lands in $OUT.
# On the lent H200, from the repo root, with structlog and cupti-python carried as wheels:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
#   bash bench/scenarios/device_run.sh
set -u
O=${OUT:-/tmp/lab-out}
mkdir -p "$O"
{
  echo "== gpu"; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
  echo "== cpus"; nproc; lscpu | grep -E "Model name|^CPU\(s\)"
  echo "== cgroup"; stat -fc %T /sys/fs/cgroup; cat /sys/fs/cgroup/cgroup.controllers /sys/fs/cgroup/cgroup.subtree_control
  cat /proc/self/cgroup
  echo "== python"; python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)'
} > "$O/env.txt" 2>&1
timeout "${LAB_T:-330}" python3 bench/scenarios/lab.py --out "$O" 2>&1 | tee "$O/lab.log" | grep -v "^\[lab" | tail -20
echo "lab rc=${PIPESTATUS[0]}"
grep -E "quota:|engine ready|daemon sources|Traceback|Error" "$O/lab.log" | head -12
