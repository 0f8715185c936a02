"""Where an engine's processes run: each one's role, engine core, CUDA_VISIBLE_DEVICES and CUDA ordinal.

Read from the process table only (titles and the environment at exec); the pipeline turns
these into GPU indices. Titles name the ranks: vLLM's `VLLM::EngineCore_DP1` and
`VLLM::Worker_DP1_TP2` (`VLLM::Worker_TP2` without data parallelism), SGLang's
`sglang::scheduler_TP3` (`sglang::scheduler_DP0_TP3`). A worker uses the device of its TP
rank among those it sees: ordinal = TP rank when it sees one engine core's share of devices,
else dp_rank x TP size + TP rank. Without CUDA_VISIBLE_DEVICES a title alone places nothing:
the engine's CUDA ordinals need not be this host's NVML indices (another container, another
device order), and a wrong GPU is worse than an unknown one.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence

from exporter.snapshot.engine import Placement
from exporter.sources import procs

MAX_PLACEMENTS = 512  # processes per engine
_CACHE_SIZE = 4096
# Ranks of at most 6 digits (a title is anyone's to set; int() refuses over 4,300 digits): past them no rank.
_CORE = re.compile(r"^(?:\S*::)?EngineCore(?:_DP(\d{1,6}))?\b")
_WORKER = re.compile(r"^VLLM::Worker(?:_DP(\d{1,6}))?(?:_PP(\d{1,6}))?_TP(\d{1,6})\b")
_SCHEDULER = re.compile(r"^sglang::scheduler(?:_DP(\d{1,6}))?(?:_PP(\d{1,6}))?_TP(\d{1,6})\b")
_MAX_SPEC = 1024  # characters of CUDA_VISIBLE_DEVICES kept

# (pid, start ticks) -> CUDA_VISIBLE_DEVICES at exec: the environment at exec never changes.
_visible_cache: OrderedDict[tuple[int, int], str | None] = OrderedDict()


def _visible(proc_root: str, info: procs.ProcInfo) -> str | None:
    """Return a process's CUDA_VISIBLE_DEVICES at exec (cached by pid and start time)."""
    key = (info.pid, info.start_ticks)
    if key in _visible_cache:
        _visible_cache.move_to_end(key)
        return _visible_cache[key]
    value = procs.read_environ(proc_root, info.pid).get("CUDA_VISIBLE_DEVICES")
    value = value[:_MAX_SPEC] if value is not None else None
    _visible_cache[key] = value
    while len(_visible_cache) > _CACHE_SIZE:
        _visible_cache.popitem(last=False)
    return value


def _rank(m: re.Match[str], group: int) -> int | None:
    value = m.group(group)
    return int(value) if value is not None else None


def _role(info: procs.ProcInfo) -> tuple[str, int | None, int | None, int | None]:
    """Return (role, dp rank, pp rank, tp rank) from a process title."""
    if m := _CORE.match(info.title):
        return "engine_core", _rank(m, 1), None, None
    if m := _WORKER.match(info.title):
        return "worker", _rank(m, 1), _rank(m, 2), _rank(m, 3)
    if m := _SCHEDULER.match(info.title):
        return "scheduler", _rank(m, 1), _rank(m, 2), _rank(m, 3)
    return "other", None, None, None


def _ordinal(visible: str | None, dp: int | None, pp: int | None, tp: int | None, tp_size: int) -> int | None:
    """Return the CUDA ordinal a rank uses among its visible devices (None when it cannot be told)."""
    if visible is None or tp is None or (pp or 0) != 0:
        return None
    count = len([x for x in visible.split(",") if x.strip()])
    ordinal = tp if count <= tp_size else (dp or 0) * tp_size + tp
    return ordinal if ordinal < count else None


def placements(
    proc_root: str, pids: Sequence[int], table: Mapping[int, procs.ProcInfo] | None = None
) -> tuple[Placement, ...]:
    """Return where each of an engine's processes runs (bounded; processes gone are skipped).

    `table` holds the processes as last read (a pid not in it is read now).
    """
    rows = table or {}
    infos = [
        i
        for pid in pids[:MAX_PLACEMENTS]
        if (i := rows.get(pid) or procs.proc_info(proc_root, pid)) is not None
    ]
    by_pid = {i.pid: i for i in infos}
    roles = {i.pid: _role(i) for i in infos}
    tp_size = 1 + max((r[3] for r in roles.values() if r[3] is not None), default=0)
    out = []
    for info in infos:
        role, dp, pp, tp = roles[info.pid]
        core = 0
        if role in ("engine_core", "scheduler"):
            core = info.pid
        else:  # the nearest engine core above it
            cur = by_pid.get(info.ppid)
            for _ in range(64):  # bounded: a table read mid-change may hold a cycle
                if cur is None or core:
                    break
                if roles[cur.pid][0] == "engine_core":
                    core = cur.pid
                    dp = roles[cur.pid][1] if dp is None else dp
                cur = by_pid.get(cur.ppid)
        visible = _visible(proc_root, info)
        if role == "engine_core" and not any(roles[p][0] == "worker" and p != info.pid for p in by_pid):
            tp = 0  # no workers: the engine core runs the model on its first visible device
        ordinal = _ordinal(visible, dp, pp, tp, tp_size) if role != "other" else None
        out.append(Placement(info.pid, role, core, visible, ordinal, dp))
    return tuple(out)
