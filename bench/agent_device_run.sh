#!/bin/bash
# One device call for the agent (issue 3): agent-check, the GPU test, accuracy, overhead, safety.
# Usage on the lent H200, from the repo root, with cupti-python 13.0.1 carried as a wheel:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
#   bash bench/agent_device_run.sh
set -u
O=${OUT:-/tmp/agent-out}
mkdir -p "$O" /tmp/bwbench
LOG=$O/agent_run.log
echo "== machine" | tee -a "$LOG"
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader 2>&1 | tee -a "$LOG"
python3 -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "py", sys.version.split()[0])' 2>&1 | tee -a "$LOG"
if [ -z "${SKIP_CHECKS:-}" ]; then
echo "== agent-check" | tee -a "$LOG"
timeout 60 python3 -m exporter agent-check > "$O/agent_check.json" 2>>"$LOG"; echo "agent-check rc=$?" | tee -a "$LOG"
python3 -c "import json;d=json.load(open('$O/agent_check.json'));print({k:d.get(k) for k in ('can_start','state','lib','mode','versions_match','libcupti_loaded_after','detail')})" 2>&1 | tee -a "$LOG"
echo "== gpu test" | tee -a "$LOG"
timeout 100 python3 -m pytest -q -m gpu tests/agent/test_agent_gpu.py -p no:cacheprovider 2>&1 | tail -4 | tee -a "$LOG"
fi
echo "== accuracy" | tee -a "$LOG"
timeout ${ACC_T:-170} python3 bench/agent_accuracy.py --out "$O/agent_accuracy_h200.json" >> "$LOG" 2>&1; echo "rc=$?"
sed -n '/^phase /,$p' "$LOG" | tail -8
echo "== overhead" | tee -a "$LOG"
timeout ${OVH_T:-200} python3 bench/agent_overhead.py --out "$O/agent_overhead_h200.json" >> "$LOG" 2>&1; echo "rc=$?"
sed -n '/^config /,$p' "$LOG" | tail -9
echo "== safety" | tee -a "$LOG"
timeout ${SAF_T:-110} python3 bench/agent_safety.py --out "$O/agent_safety_h200.json" >> "$LOG" 2>&1; echo "rc=$?"
grep '^safety:' "$LOG" | tail -1
python3 -c "
import json; d=json.load(open('$O/agent_safety_h200.json'))
p=d['profiler']; print('profiler:', {k: p.get(k) for k in ('state_during','state_after','profiler_cuda_events','windows_after','records_after','busy_after_ratio','reattaches','final_state')})
a=json.load(open('$O/agent_accuracy_h200.json')); print('matched:', [r.get('cupti_windows_matched', False) for r in a['phases']])
" 2>&1
cp /tmp/bwbench/*.log "$O/" 2>/dev/null
grep -iE "error|traceback" "$LOG" | head -20
