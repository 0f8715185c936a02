#!/usr/bin/env bash
# Run tests/agent/test_real_engines.py against the real vLLM and SGLang packages.
#
# Each engine lives in its own venv (their torch pins conflict): VLLM_VENVS (default
# /work/venvs/engines, vLLM 0.33, then /work/venvs/vllm-0.11.2 and /work/venvs/vllm-0.10.2 where
# present) and SGLANG_VENV (default /work/venvs/sglang). Each venv needs this
# project installed for its entry points: `pip install -e <repo> --no-deps`, plus pytest,
# pytest-asyncio, aiohttp, prometheus-client, structlog, psutil, nvidia-ml-py, numpy.
# Prints the versions that ran; extra arguments go to pytest.
set -u
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VLLM_VENVS="${VLLM_VENVS:-/work/venvs/engines /work/venvs/vllm-0.11.2 /work/venvs/vllm-0.10.2}"
SGLANG_VENV="${SGLANG_VENV:-/work/venvs/sglang}"
rc=0
ran=0
for venv in $VLLM_VENVS "$SGLANG_VENV"; do
  py="$venv/bin/python"
  if [ ! -x "$py" ]; then
    echo "== $venv: no python there, skipped"
    continue
  fi
  echo "== $venv"
  PYTHONPATH="$ROOT" "$py" - <<'PY'
import importlib.metadata as md
import sys
print("python", sys.version.split()[0])
for dist in ("vllm", "sglang", "torch", "boundwatch"):
    try:
        print(f"{dist} {md.version(dist)}")
    except md.PackageNotFoundError:
        print(f"{dist} (not installed)")
PY
  (cd "$ROOT" && PYTHONPATH="$ROOT" "$py" -m pytest -q -p no:cacheprovider -rs \
      tests/agent/test_real_engines.py "$@") || rc=1
  ran=1
done
[ "$ran" = 1 ] || { echo "no engine venv found"; exit 2; }
exit $rc
