#!/bin/bash
# One device call per agent mode for the field-hard scenario lab (issue 9 item 6); everything lands in $OUT.
# On the lent H200, from the repo root (16 cores, cgroup v2, root; torch, triton, nvidia-ml-py,
# prometheus-client, psutil, aiohttp installed; structlog, bcrypt, cupti-python as wheels in .whl/,
# installed here into /tmp/site when present):
#   MODE=none  bash bench/scenarios/device_run.sh     # no agent in the engine
#   MODE=light bash bench/scenarios/device_run.sh     # exporter.agent.start(role="generic")
#   MODE=cupti bash bench/scenarios/device_run.sh     # exporter.agent.start(role="generic", mode="cupti")
#   SCALE=0.2 MODE=light bash bench/scenarios/device_run.sh   # a ~2-minute check (5 s scenarios), named scenarios-check-*
# Comes back (4 files): env.txt, lab.log (its tail), <name>.json, <name>.jsonl.gz (name: scenarios-field-$MODE).
# LAB_ARGS passes more lab flags (e.g. --us-per-token 3 or --engine-json '{"eager_target_busy": 0.8}').
set -u
MODE=${MODE:-none}
SCALE=${SCALE:-1}
O=${OUT:-/tmp/lab-out}
mkdir -p "$O"
if ls .whl/*.whl >/dev/null 2>&1 && [ ! -d /tmp/site/structlog ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
NAME="scenarios-field-$MODE"
[ "$SCALE" != "1" ] && NAME="scenarios-check-$MODE"
{
  echo "== commit"; git rev-parse HEAD 2>/dev/null; git log -1 --format=%s 2>/dev/null
  echo "== gpu"; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
  echo "== cpus"; nproc; lscpu | grep -E "Model name|^CPU\(s\)"
  echo "== cgroup"; stat -fc %T /sys/fs/cgroup; cat /sys/fs/cgroup/cgroup.controllers /sys/fs/cgroup/cgroup.subtree_control
  cat /proc/self/cgroup
  echo "== python"; python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)'
  python3 -c 'import cupti; print("cupti-python", getattr(cupti, "__version__", "?"))' 2>&1 | tail -1
  echo "== mode $MODE scale $SCALE name $NAME"
} > "$O/env.txt" 2>&1
timeout "${LAB_T:-570}" python3 bench/scenarios/lab.py --agent "$MODE" --scale "$SCALE" --name "$NAME" --out "$O" \
  ${LAB_ARGS:-} > /tmp/lab-full.log 2>&1
rc=$?
tail -c 50000 /tmp/lab-full.log > "$O/lab.log"
echo "lab rc=$rc"
grep -E "quota:|engine ready|daemon sources|Traceback|Error|failed" /tmp/lab-full.log | cut -c1-1500 | head -12
grep -E "^\||^agent:" /tmp/lab-full.log
