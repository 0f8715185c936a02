"""CPU of `wire.decode` on the sidecar_cost stand-in's datagram (one window, 100 intervals), per source tree.

Prints, for the tree given, the best of 5 runs of 20,000 decodes (process CPU per decode, us)
next to plain `json.loads` of the same bytes; run it for each tree in turn, alternating.

    .venv/bin/python bench/wire_decode_ab.py /tmp/base
"""

from __future__ import annotations

import json
import sys
import time

sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else ".")

from exporter import wire

T0 = 1_700_000_000_000_000_000


def main() -> int:
    spans = [(T0 + k * 5_000_000, T0 + k * 5_000_000 + 4_000_000) for k in range(100)]
    iv = wire.pack_intervals(spans, T0)[0]
    w = wire.Window(dev=0, t0=T0, t1=T0 + 500_000_000, busy=400_000_000, kernels=8000, graphs=100, iv=iv)
    uuid = "GPU-00000000-0000-0000-0000-000000000001"
    msg = wire.Message(
        pid=10000, state="running", seq=1, role="vllm_worker", devices=((0, uuid),), windows=(w,)
    )
    data = wire.encode(msg)
    n = 20000
    for name, f in (("json.loads", lambda: json.loads(data)), ("decode", lambda: wire.decode(data))):
        best = 1e9
        for _ in range(5):
            c = time.process_time()
            for _ in range(n):
                f()
            best = min(best, (time.process_time() - c) / n)
        print(name, len(data), f"{best * 1e6:.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
