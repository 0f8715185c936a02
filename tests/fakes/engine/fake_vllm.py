"""A stand-in for `vllm serve` with two API servers: run as `python fake_vllm.py vllm serve M --port P ...`.

It serves a page on 127.0.0.1:P and starts two children titled like vLLM's API servers:
`VLLM::APIServer_0` spins one thread at 100% (a saturated tokenizer), `VLLM::APIServer_1` idles.
It prints "ready" once both children run and exits, with them, when its stdin closes.
"""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading

SPIN = """
import ctypes, sys, threading, time
ctypes.CDLL(None).prctl(15, b"VLLM::APIServer", 0, 0, 0)
threading.Thread(target=lambda: time.sleep(3600), name="idle", daemon=True).start()
busy = sys.argv[1] == "busy"
while True:
    if busy:
        for _ in range(100000):
            pass
    else:
        time.sleep(0.5)  # rare wakes: on a loaded host each wake's run-queue wait counts as demand
    if sys.stdin.closed:
        break
"""


def main() -> None:
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    page = open(args[args.index("--page") + 1], "rb").read()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *a: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    children = [
        subprocess.Popen([f"VLLM::APIServer_{i}", "-c", SPIN, mode], executable=sys.executable)
        for i, mode in enumerate(("busy", "idle"))
    ]
    print("ready", flush=True)
    try:
        sys.stdin.read()
    finally:
        for c in children:
            c.kill()
            c.wait()
        server.shutdown()


if __name__ == "__main__":
    main()
