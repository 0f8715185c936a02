"""Build an engine's process tree in a PID namespace of its own and report what boundwatch finds in it.

Run as PID 1 of `unshare --pid --fork --mount-proc python multigpu_tree.py SPEC_JSON`: it starts
each node of SPEC (argv, env, children) as a real, titled process (`argv[0]` is the title, or a
path named `vllm` for `vllm serve`), with CUDA_VISIBLE_DEVICES as the node sets it (a node without
one has none); once all run it prints, as JSON, the engines `discover` finds and each one's
`placement.placements`, then exits (and the kernel ends the namespace's processes with it).
As a node (`--node SPEC_JSON`, any argv[0]) it starts its children and sleeps.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _spawn(node: dict, shim_dir: str, exe: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(node.get("env", {}))
    args = list(node["argv"])
    payload = ["--node", json.dumps({"children": node.get("children", []), "shim": shim_dir, "exe": exe})]
    if args[0] == "vllm":  # `vllm serve ...`: run through a path whose base name is vllm
        return subprocess.Popen([exe, os.path.join(shim_dir, "vllm"), *args[1:], *payload], env=env)
    if args[0] == "python":  # `python -m sglang.launch_server ...`
        return subprocess.Popen([exe, os.path.abspath(__file__), *args[1:], *payload], env=env)
    return subprocess.Popen([args[0], os.path.abspath(__file__), *payload], executable=exe, env=env)


def _count(nodes: list[dict]) -> int:
    return sum(1 + _count(n.get("children", [])) for n in nodes)


def _titles(nodes: list[dict]) -> list[str]:
    """Return the titles of the titled nodes (the roots are run through a path, never titled)."""
    out = []
    for n in nodes:
        if n["argv"][0] not in ("vllm", "python"):
            out.append(n["argv"][0])
        out += _titles(n.get("children", []))
    return out


def _node(payload: dict) -> None:
    kids = [_spawn(c, payload["shim"], payload["exe"]) for c in payload["children"]]
    while kids is not None:  # until the namespace ends (its PID 1 exits)
        time.sleep(60)


def _orchestrate(spec: list[dict]) -> None:
    sys.path.insert(0, ROOT)
    from exporter.config import Config
    from exporter.snapshot.engine import EngineReading
    from exporter.sources import placement, procs
    from exporter.sources.engine import EngineSource
    from exporter.sources.engine_discovery import discover

    shim = tempfile.mkdtemp()
    os.symlink(os.path.abspath(__file__), os.path.join(shim, "vllm"))
    for node in spec:
        _spawn(node, shim, sys.executable)
    want, titled = _count(spec) + 1, sorted(_titles(spec))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        table = list(procs.processes("/proc"))
        # every process up and past its exec (until then a child shows its parent's command line)
        seen = sorted(p.title for p in table if p.title in titled)
        if len(table) >= want and seen == titled and all("--node" in p.cmdline for p in table if p.pid != 1):
            break
        time.sleep(0.05)
    out = []
    source = EngineSource(Config(), proc_root="/proc")
    for t in discover("/proc"):
        # what the engine source puts in its readings (the page's figures aside)
        read = source._with_processes(t, EngineReading(name=t.name, kind=t.kind or ""), {})
        out.append(
            {
                "name": t.name,
                "kind": t.kind,
                "engine_pids": list(t.engine_pids),
                "api_server_pids": list(t.api_server_pids),
                "cuda_visible_devices": t.cuda_visible_devices,
                "placements": [dataclasses.asdict(p) for p in placement.placements("/proc", t.engine_pids)],
                "source_placements": [dataclasses.asdict(p) for p in read.placements],
            }
        )
    source.close()
    titles = {p.pid: p.title for p in procs.processes("/proc")}
    print(json.dumps({"engines": out, "titles": titles}), flush=True)


if __name__ == "__main__":
    if "--node" in sys.argv:
        _node(json.loads(sys.argv[sys.argv.index("--node") + 1]))
    else:
        _orchestrate(json.loads(sys.argv[1]))
