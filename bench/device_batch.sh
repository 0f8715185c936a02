#!/bin/bash
# One device call, several GPU benchmarks in a row; everything lands in $OUT (at most 8 files come back).
# On the lent H200, from the repo root; wheels for structlog, bcrypt and cupti-python in .whl/ (carried).
# More than 8 files in $OUT (a call brings back 8): all but env.txt come back packed in results.tar.gz.
#   STEPS="env two light lab:none" bash bench/device_batch.sh
# Steps:
#   env        machine, driver, torch, commit                      -> env.txt
#   two        bench/two_engines_one_gpu.py (two agents, one GPU)  -> two_engines_one_gpu_h200.json
#   light      bench/light_agent_overhead.py --rounds 2 (LIGHT_ARGS: e.g. --agent-env BOUNDWATCH_AGENT_INLINE=off) -> light_overhead_h200.json
#   lab:MODE   bench/scenarios/lab.py --agent MODE (SCALE, 0.7)    -> scenarios-h200-MODE.{json,jsonl.gz,log}
#   lab:MODE:T the same with the agent and daemon from .T/'s exporter/ (a branch beside main) -> scenarios-h200-MODE-T.*
#   twolab     bench/two_engines_lab.py (two lab engines, one GPU) -> two_engines_lab_h200.json
#   side       bench/sidecar_beside_engine.py (real NVML, 15 s scrapes; SIDE_ARGS: e.g. --trees .side-base,. --rounds 2, SIDE_T;
#              --cost-stats "$OUT/side_stats" for the daemon's parts, a separate run: the timing adds CPU) -> sidecar_beside_engine_h200.json
#   nvml       bench/nvml_calls.py (NVML per call and per tick)     -> nvml_calls_h200.json
#   truth      bench/agent_graph_truth.py, late starts at b=1 and 8  -> agent_graph_truth_late_h200.json
#   parts      bench/light_step_parts.py (the light step's parts, paired) -> light_step_parts_h200.json
#   eager      bench/eager_processes.py (the eager loop before/after the agent starts, each process) -> eager_processes_h200.json
#   periods[:T] bench/light_agent_periods.py (agent on/off periods in one process; :T imports exporter/ from .T/; PERIODS_ARGS: e.g. --pause 35) -> light_periods_h200[_T].json
#   phases     bench/agent_phases.py (the light agent's swaps and tick phases on a vLLM-shaped engine's thread) -> agent_phases_h200.json
#   gputests   the GPU-marked tests (probe and agent)                -> gpu_tests.txt
#   probe      bench/probe_h200.py --sidecar (the self-test through the sidecar) -> probe_h200.json
set -u
O=${OUT:-/tmp/batch-out}
mkdir -p "$O"
if ls .whl/*.whl >/dev/null 2>&1 && [ ! -d /tmp/site/structlog ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
SCALE=${SCALE:-0.7}
for step in ${STEPS:-env}; do
  t0=$(date +%s)
  case "$step" in
    env)
      {
        echo "== commit (the copy's .git may lag its files: the tree's own hash follows)"; git rev-parse HEAD 2>/dev/null
        echo "== tree: exporter/*.py files and the hash of their hashes (compare: the same line run here)"
        find exporter -name '*.py' -exec sha1sum {} + | LC_ALL=C sort -k2 | tee /tmp/tree.sha | wc -l; sha1sum < /tmp/tree.sha
        echo "== gpu"; nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
        echo "== cpus"; nproc; lscpu | grep -E "Model name"
        echo "== net.unix.max_dgram_qlen (the agents' socket queue)"; cat /proc/sys/net/unix/max_dgram_qlen
        echo "== python"; python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)'
        python3 -c 'import cupti; print("cupti-python", getattr(cupti, "__version__", "?"))' 2>&1 | tail -1
      } > "$O/env.txt" 2>&1 ;;
    two)
      timeout 200 python3 bench/two_engines_one_gpu.py --out "$O/two_engines_one_gpu_h200.json" \
        > /tmp/two.log 2>&1; echo "two rc=$?"; tail -25 /tmp/two.log ;;
    light)
      timeout "${LIGHT_T:-240}" python3 bench/light_agent_overhead.py --rounds "${LIGHT_ROUNDS:-2}" --seconds "${LIGHT_SECONDS:-2}" ${LIGHT_ARGS:-} \
        --out "$O/light_overhead_h200.json" > /tmp/light.log 2>&1; echo "light rc=$?"; tail -30 /tmp/light.log ;;
    twolab)
      timeout 200 python3 bench/two_engines_lab.py --out "$O/two_engines_lab_h200.json" > /tmp/twolab.log 2>&1
      echo "twolab rc=$?"; tail -12 /tmp/twolab.log ;;
    side)
      timeout "${SIDE_T:-200}" python3 bench/sidecar_beside_engine.py ${SIDE_ARGS:-} --out "$O/sidecar_beside_engine_h200.json" \
        > /tmp/side.log 2>&1; echo "side rc=$?"; tail -6 /tmp/side.log ;;
    eager)
      timeout "${EAGER_T:-300}" python3 bench/eager_processes.py --rounds "${EAGER_ROUNDS:-4}" --seconds "${EAGER_SECONDS:-2}" \
        ${EAGER_ARGS:-} --out "$O/eager_processes_h200.json" > /tmp/eager.log 2>&1; echo "eager rc=$?"; tail -22 /tmp/eager.log ;;
    periods|periods:*)
      tag=${step#periods}; tag=${tag#:}
      if [ -n "$tag" ]; then wl=${PERIODS_TREE_WORKLOADS:-decode_b1}; tree=(--tree ".$tag" --aa 0); else wl=${PERIODS_WORKLOADS:-decode_b1,decode_b8,decode_8b,eager}; tree=(--aa "${PERIODS_AA:-3}"); fi
      timeout "${PERIODS_T:-400}" python3 bench/light_agent_periods.py --workloads "$wl" --pairs "${PERIODS_PAIRS:-6}" \
        --period "${PERIODS_SECONDS:-2}" --budget $(( ${PERIODS_T:-400} - 15 )) "${tree[@]}" ${PERIODS_ARGS:-} --out "$O/light_periods_h200${tag:+_$tag}.json" > "/tmp/periods$tag.log" 2>&1
      echo "periods $tag rc=$?"; tail -8 "/tmp/periods$tag.log" ;;
    phases)
      timeout "${PHASES_T:-200}" python3 bench/agent_phases.py --rounds "${PHASES_ROUNDS:-3}" --seconds "${PHASES_SECONDS:-6}" \
        --out "$O/agent_phases_h200.json" > /tmp/phases.log 2>&1; echo "phases rc=$?"; tail -40 /tmp/phases.log ;;
    nvml)
      timeout 120 python3 bench/nvml_calls.py --out "$O/nvml_calls_h200.json" > /tmp/nvml.log 2>&1
      echo "nvml rc=$?"; tail -25 /tmp/nvml.log ;;
    truth)
      timeout 300 python3 bench/agent_graph_truth.py --batches "${TRUTH_BATCHES:-1,8}" --gaps "${TRUTH_GAPS:-0}" \
        --seconds 3 --only "${TRUTH_ONLY:-early_graphtrace,late_kernels,late_precapture}" \
        --out "$O/agent_graph_truth_late_h200.json" > /tmp/truth.log 2>&1; echo "truth rc=$?"; tail -30 /tmp/truth.log ;;
    parts)
      timeout 300 python3 bench/light_step_parts.py --seconds "${PARTS_SECONDS:-4}" \
        --out "$O/light_step_parts_h200.json" > /tmp/parts.log 2>&1; echo "parts rc=$?"; grep -E '^\||clocksource|Error|Traceback' /tmp/parts.log | tail -40 ;;
    gputests)
      timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/probe/test_probe_gpu.py \
        tests/agent/test_agent_gpu.py > "$O/gpu_tests.txt" 2>&1; echo "gputests rc=$?"; tail -6 "$O/gpu_tests.txt" ;;
    probe)
      timeout 240 python3 bench/probe_h200.py --sidecar --seconds "${PROBE_SECONDS:-3}" --out "$O/probe_h200.json" \
        > /tmp/probe.log 2>&1; echo "probe rc=$?"; tail -12 /tmp/probe.log ;;
    lab:*)
      mode=${step#lab:}; tag=""
      case "$mode" in *:*) tag=${mode#*:}; mode=${mode%%:*} ;; esac
      name="scenarios-h200-$mode${tag:+-$tag}"
      timeout "${LAB_T:-330}" python3 bench/scenarios/lab.py --agent "$mode" --scale "$SCALE" \
        ${tag:+--tree ".$tag"} --name "$name" --out "$O" ${LAB_ARGS:-} > "/tmp/$name.log" 2>&1
      echo "lab $mode${tag:+ on .$tag} rc=$?"
      tail -c 40000 "/tmp/$name.log" > "$O/$name.log"
      grep -E "API-server cost|Traceback|Error|failed" "/tmp/$name.log" | cut -c1-600 | head -8
      grep -E "^\||^agent:" "/tmp/$name.log" ;;
    *) echo "unknown step $step" ;;
  esac
  echo "== $step took $(( $(date +%s) - t0 )) s"
done
# A call brings back at most 8 files: past 8, pack everything but env.txt into one archive (untar it here)
if [ "$(find "$O" -maxdepth 1 -type f | wc -l)" -gt 8 ]; then
  ( cd "$O" && find . -maxdepth 1 -type f ! -name env.txt ! -name results.tar.gz -printf '%P\n' > /tmp/pack.list \
    && tar -czf results.tar.gz -T /tmp/pack.list && xargs rm -f < /tmp/pack.list )
  echo "== more than 8 files: packed into results.tar.gz ($(wc -l < /tmp/pack.list) files)"
fi
