"""The status page on `/`: per GPU, the verdict timeline over the history window with its reasons, and the evidence.

One self-contained HTML document (inline CSS and SVG, no script, no outside asset) rendered from the
sampler's bounded history of Snapshots. Every text that came from outside (GPU, engine and model
names, source errors) is HTML-escaped; command lines and environments are never read here. The
size is bounded: at most MAX_GPUS GPUs (host-bound ones first, with a note) and at most
MAX_COLUMNS ticks per timeline (a longer history is sampled down).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from html import escape

from exporter.snapshot import Snapshot
from exporter.snapshot.engine import EngineReading
from exporter.snapshot.verdict import Verdict

MAX_GPUS = 16
MAX_COLUMNS = 300  # timeline ticks drawn per GPU: a longer history is sampled down to this many
MAX_ENGINES = 32
MAX_TEXT = 120  # characters of one outside text (a name, an error) shown

WIDTH = 560  # the timeline's drawing, px (the busy scale's labels go right of it)
SCALE_W = 34
BUSY_TOP, BUSY_H = 5.0, 70.0  # the busy line's lane
BAND_TOP, BAND_H = 80.0, 22.0  # the verdict band
HEIGHT = 104
TITLE_MIN_PX = 3.0  # a run this wide gets a tooltip
LABEL_PX_PER_CHAR = 6.6  # a run gets its name written in the band where the name fits (11 px text)

VERDICT_TEXT = {"gpu": "GPU-bound", "host": "host-bound", "idle": "idle", "unknown": "unknown"}
REASON_TEXT = {
    "cpu_quota_throttled": "CPU quota throttled",
    "api_server_saturated": "API server saturated",
    "cuda_graph_fallback": "CUDA graphs not used",
    "admission_stalled": "admission stalled",
    "scheduler_stalled": "requests held in the queue",
    "step_overhead": "step overhead",
    "unknown": "cause unknown",
    "no_busy_source": "no busy figure",
    "no_engine_source": "no engine found",
    "no_gpu_mapping": "engine's GPU unknown",
}
SHORT_TEXT = {
    "cpu_quota_throttled": "CPU quota",
    "api_server_saturated": "API server",
    "cuda_graph_fallback": "no graphs",
    "admission_stalled": "admission",
    "scheduler_stalled": "queue held",
    "step_overhead": "step overhead",
    "unknown": "host",
}
# The band's colour: the verdict, and for host-bound the first (root-cause) reason.
COLOUR = {
    "gpu": "#2f9e44",
    "idle": "#ced4da",
    "unknown": "#868e96",
    "host": "#e03131",
    "host:cpu_quota_throttled": "#f08c00",
    "host:api_server_saturated": "#e03131",
    "host:cuda_graph_fallback": "#ae3ec9",
    "host:admission_stalled": "#d6336c",
    "host:scheduler_stalled": "#1971c2",
    "host:step_overhead": "#a0522d",
    "host:unknown": "#862e2e",
}
DARK_TEXT = frozenset({"idle"})  # bands light enough for dark text
# The evidence row each host-bound reason points at (highlighted, with busy, when the reason is given).
HOT = {
    "admission_stalled": "queue",
    "scheduler_stalled": "queue",
    "api_server_saturated": "api",
    "cpu_quota_throttled": "quota",
    "cuda_graph_fallback": "graphs",
}

CSS = """
*{box-sizing:border-box}
body{font:14px/1.4 "DejaVu Sans",system-ui,sans-serif;margin:0;padding:18px 24px;color:#212529;background:#f8f9fa}
h1{font-size:20px;margin:0 0 2px}h1 small{font-weight:normal;color:#868e96;font-size:13px}
.sub{color:#495057;margin:0 0 12px}
.banner{background:#ffe066;padding:6px 10px;font-weight:bold;margin:0 0 10px;border-radius:4px}
.stale{background:#ffc9c9;padding:6px 10px;font-weight:bold;margin:0 0 10px;border-radius:4px}
.summary{display:flex;gap:10px;flex-wrap:wrap;align-items:center;margin:0 0 10px}
.chip{padding:3px 10px;border-radius:12px;color:#fff;font-weight:bold}
.chip.idle{color:#212529}
.headline{font-size:15px;margin:0 0 12px}
.legend{display:flex;gap:14px;flex-wrap:wrap;font-size:12px;color:#495057;margin:0 0 8px}
.legend i{display:inline-block;width:12px;height:12px;border-radius:2px;vertical-align:-2px;margin-right:4px}
.grid{display:grid;grid-template-columns:290px 620px minmax(300px,1fr);background:#fff;border:1px solid #dee2e6;border-radius:6px}
.grid>div{padding:8px 12px;border-top:1px solid #e9ecef}
.head{font-size:12px;color:#868e96;border-top:none!important}
.axis{display:flex;justify-content:space-between}
.gpu-id{font-weight:bold;font-size:15px}
.meta{color:#868e96;font-size:12px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.verdict{display:inline-block;margin:6px 8px 4px 0;padding:2px 8px;border-radius:4px;color:#fff;font-weight:bold}
.verdict.idle{color:#212529}
.reasons{font-size:13px}
.held{color:#495057;font-size:12px;white-space:nowrap}
svg{display:block}
dl{display:grid;grid-template-columns:105px 1fr;gap:1px 10px;margin:0;font-size:13px}
dt{color:#868e96}dd{margin:0;font-variant-numeric:tabular-nums}
dt.hot,dd.hot{color:#c92a2a;font-weight:bold}
.note{color:#868e96;font-size:12px;margin:6px 0}
table{border-collapse:collapse;font-size:13px;background:#fff}
td,th{padding:3px 10px;text-align:left;border-bottom:1px solid #e9ecef}
th{color:#868e96;font-weight:normal}
.up{color:#2b8a3e}.down{color:#c92a2a}
h2{font-size:15px;margin:18px 0 6px}
.cols{display:flex;gap:30px;flex-wrap:wrap;align-items:flex-start}
footer{margin-top:16px;color:#868e96;font-size:12px}
"""


def clip(text: object) -> str:
    """Return an outside text shortened to MAX_TEXT characters and HTML-escaped."""
    s = str(text)
    if len(s) > MAX_TEXT:
        s = s[: MAX_TEXT - 1] + "…"
    return escape(s, quote=True)


def colour_key(v: Verdict) -> str:
    """Return the COLOUR key of a verdict: `host:<first reason>` for host-bound, else the verdict."""
    if v.verdict == "host" and v.reasons:
        key = f"host:{v.reasons[0]}"
        return key if key in COLOUR else "host"
    return v.verdict if v.verdict in COLOUR else "unknown"


def reasons_text(reasons: Iterable[str]) -> str:
    """Return reasons as a person reads them, escaped."""
    return escape(", ".join(REASON_TEXT.get(r, r) for r in reasons))


def ago(seconds: float) -> str:
    """Return a time before now as a short label (`-90 s`, `-2 min`, `now`)."""
    if seconds <= 0:
        return "now"
    if seconds >= 120 and seconds % 60 == 0:
        return f"-{seconds / 60:g} min"
    return f"-{seconds:g} s"


@dataclass
class _Run:
    x0: float  # px where its first tick is drawn
    x1: float  # px where it stops (the next tick, or now)
    verdict: Verdict  # its first tick's verdict


@dataclass
class Track:
    """One GPU's history as drawn, oldest first: x in px, x formatted, the verdict, per kept tick.

    Parallel lists of floats, strings and the Snapshots' own Verdicts: a render allocates no
    object per tick that the garbage collector must track (a tuple each would wake it up several
    times per render over a heap of Snapshots).
    """

    x: list[float] = field(default_factory=list)
    xs: list[str] = field(default_factory=list)
    v: list[Verdict] = field(default_factory=list)


# The busy line's y for busy 0%, 1%, ... 100%.
_BUSY_Y = tuple(f"{BUSY_TOP + BUSY_H * (1 - k / 100):.1f}" for k in range(101))


def stride(ticks: int) -> int:
    """Return every how many ticks one is drawn, so that at most MAX_COLUMNS are."""
    return max(1, math.ceil(ticks / MAX_COLUMNS))


def tracks(history: Sequence[Snapshot], gpus: Sequence[int], window: float) -> dict[int, Track]:
    """Return each shown GPU's ticks placed on the timeline, sampled down to at most MAX_COLUMNS ticks."""
    out = {g: Track() for g in gpus}
    if not history:
        return out
    every = stride(len(history))
    kept = history[::-1][::every][::-1] if every > 1 else history
    scale = WIDTH / window
    left = history[-1].mono - window
    for snap in kept:
        x = (snap.mono - left) * scale
        if x < 0:
            continue
        xs = f"{x:.1f}"
        for v in snap.verdicts:
            track = out.get(v.gpu)
            if track is not None:
                track.x.append(x)
                track.xs.append(xs)
                track.v.append(v)
    return out


def runs(track: Track, gap_px: float) -> list[_Run]:
    """Return the track's runs of one colour (host-bound by its first reason); a gap over `gap_px` starts anew."""
    out: list[_Run] = []
    last: _Run | None = None
    verdict = ""
    first: tuple[str, ...] = ()
    prev = -math.inf
    for x, v in zip(track.x, track.v, strict=True):
        if last is not None:
            last.x1 = x if x - prev <= gap_px else prev + gap_px / 3
            if x - prev <= gap_px and v.verdict == verdict and (verdict != "host" or v.reasons[:1] == first):
                prev = x
                continue
        last = _Run(x, WIDTH, v)
        out.append(last)
        verdict, first = v.verdict, v.reasons[:1]
        prev = x
    if last is not None:
        last.x1 = WIDTH
    return out


def busy_path(track: Track, gap_px: float) -> str:
    """Return the busy line's SVG path data: a break where busy is unknown or ticks are missing."""
    path: list[str] = []
    pen = "M"
    prev = -math.inf
    ys = _BUSY_Y
    for x, xs, v in zip(track.x, track.xs, track.v, strict=True):
        busy = v.busy_ratio
        if busy is None:
            pen = "M"
            continue
        if x - prev > gap_px:
            pen = "M"
        prev = x
        k = int(busy * 100 + 0.5)
        path.append(f"{pen}{xs} {ys[0 if k < 0 else 100 if k > 100 else k]}")
        pen = "L"
    return "".join(path)


_SVG_HEAD = (
    f'<svg class="timeline" width="{WIDTH + SCALE_W}" height="{HEIGHT}" '
    f'viewBox="0 0 {WIDTH + SCALE_W} {HEIGHT}" role="img">'
    f'<rect x="0" y="{BUSY_TOP}" width="{WIDTH}" height="{BUSY_H}" fill="#f1f3f5"/>'
    + "".join(
        f'<line x1="0" x2="{WIDTH}" y1="{y:g}" y2="{y:g}" stroke="#dee2e6" stroke-dasharray="3 3"/>'
        for y in (BUSY_TOP + BUSY_H / 2,)
    )
    + "".join(
        f'<line x1="{WIDTH * k / 4:g}" x2="{WIDTH * k / 4:g}" y1="{BUSY_TOP}" y2="{BAND_TOP + BAND_H}" '
        'stroke="#dee2e6"/>'
        for k in range(1, 4)
    )
    + "".join(
        f'<text x="{WIDTH + 4}" y="{y + 4:g}" font-size="10" fill="#868e96">{label}</text>'
        for y, label in (
            (BUSY_TOP + 4, "100%"),
            (BUSY_TOP + BUSY_H / 2, "50%"),
            (BUSY_TOP + BUSY_H - 2, "0%"),
        )
    )
)


def band_label(v: Verdict, width: float) -> str:
    """Return the name written in a run of the band: its reason (long, else short) or verdict, where it fits."""
    names: tuple[str, ...]
    if v.verdict == "host" and v.reasons:
        names = (REASON_TEXT.get(v.reasons[0], ""), SHORT_TEXT.get(v.reasons[0], ""))
    else:
        names = (VERDICT_TEXT.get(v.verdict, ""),)
    for name in names:
        if name and (len(name) + 1) * LABEL_PX_PER_CHAR <= width:
            return name
    return ""


@functools.lru_cache(maxsize=64)
def _rect_head(verdict: str, key: str) -> str:
    """Return the start of a band run's rect: its class, verdict, colour and the band's place."""
    return (
        f'<rect class="seg" data-verdict="{escape(verdict)}" fill="{COLOUR[key]}" '
        f'y="{BAND_TOP}" height="{BAND_H}"'
    )


@functools.lru_cache(maxsize=256)
def _title(verdict: str, reasons: tuple[str, ...]) -> str:
    """Return a run's tooltip text: the verdict and its reasons, escaped."""
    title = VERDICT_TEXT.get(verdict) or escape(verdict)
    return f"{title}: {reasons_text(reasons)}" if reasons else title


def timeline(track: Track, window: float, gap: float) -> tuple[str, list[_Run]]:
    """Return one GPU's SVG (busy line above, verdict band below) and its runs."""
    scale = WIDTH / window
    gap_px = gap * scale
    parts = [_SVG_HEAD]
    found = runs(track, gap_px)
    for run in found:
        x0, w = run.x0, run.x1 - run.x0
        if w <= 0:
            continue
        v = run.verdict
        key = colour_key(v)
        rect = f'{_rect_head(v.verdict, key)} x="{x0:.1f}" width="{max(w, 0.8):.1f}"'
        if w < TITLE_MIN_PX:  # too thin to point at: no tooltip, no label, fewer bytes
            parts.append(rect + "/>")
            continue
        parts.append(f"{rect}><title>{_title(v.verdict, v.reasons)} ({w / scale:.0f} s)</title></rect>")
        label = band_label(v, w)
        if label:
            fill = "#212529" if key in DARK_TEXT else "#fff"
            parts.append(
                f'<text x="{x0 + w / 2:.1f}" y="{BAND_TOP + 15}" text-anchor="middle" font-size="11" '
                f'fill="{fill}" pointer-events="none">{escape(label)}</text>'
            )
    path = busy_path(track, gap_px)
    if path:
        parts.append(f'<path class="busy" d="{path}" fill="none" stroke="#1c7ed6" stroke-width="1.6"/>')
    parts.append("</svg>")
    return "".join(parts), found


def _num(v: Verdict, key: str) -> float | None:
    value = v.get(key)
    return value if isinstance(value, float) and math.isfinite(value) else None


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.0%}"


def evidence(v: Verdict) -> str:
    """Return the evidence beside one GPU's timeline: busy, queue, API server, quota, graphs, power."""
    hot = {"busy", *(HOT[r] for r in v.reasons if r in HOT)} if v.verdict == "host" else set()
    running, waiting = _num(v, "running"), _num(v, "waiting")
    queue = (
        "–"
        if running is None and waiting is None
        else f"{running or 0:.0f} running · {waiting or 0:.0f} waiting"
    )
    api = _num(v, "api_server_thread_cpu")
    quota, throttled = _num(v, "quota_cores"), _num(v, "throttled_share")
    throttle = "–" if throttled is None else f"{throttled:.0%} of periods throttled"
    if quota is not None:
        throttle += f" (quota {quota:g} cores)"
    graph, graph_steps = _num(v, "graph_share"), _num(v, "graph_step_share")
    if graph is not None:
        graphs = f"{graph:.0%} of busy time"
    elif graph_steps is not None:
        graphs = f"{graph_steps:.0%} of steps"
    else:
        graphs = "–"
    power, limit = _num(v, "power_watts"), _num(v, "power_limit_watts")
    watts = "–" if power is None else f"{power:.0f} W" + ("" if limit is None else f" of {limit:.0f} W")
    # GPM graphics stood in for by SM_UTIL this tick (far from every edge): said beside the source
    estimated = ", estimated from SM" if v.get("busy_estimated") else ""
    source = "" if v.busy_source is None else f" ({escape(v.busy_source)}{estimated})"
    rows = (
        ("busy", "busy", _pct(v.busy_ratio) + source),
        ("queue", "engine queue", queue),
        ("api", "API server", "–" if api is None else f"busiest thread {api:.2f} core"),
        ("quota", "cgroup", throttle),
        ("graphs", "CUDA graphs", graphs),
        ("power", "power", watts),
    )
    cells = []
    for key, name, value in rows:
        cls = ' class="hot"' if key in hot else ""
        cells.append(f'<dt{cls}>{name}</dt><dd{cls} data-evidence="{key}">{value}</dd>')
    return f'<dl class="evidence">{"".join(cells)}</dl>'


def shown_gpus(snap: Snapshot, limit: int) -> tuple[list[int], int]:
    """Return the GPUs to draw (host-bound first when there are more than `limit`) and how many exist."""
    indices = sorted({g.index for g in snap.gpus} | {v.gpu for v in snap.verdicts})
    if len(indices) <= limit:
        return indices, len(indices)
    verdicts = {v.gpu: v.verdict for v in snap.verdicts}
    order = {"host": 0, "unknown": 1, "gpu": 2, "idle": 3}
    worst = sorted(indices, key=lambda g: (order.get(verdicts.get(g, "unknown"), 1), g))[:limit]
    return sorted(worst), len(indices)


def _engines_by_gpu(engines: Sequence[EngineReading]) -> dict[int, list[EngineReading]]:
    out: dict[int, list[EngineReading]] = {}
    for e in engines:
        for g in e.gpus:
            out.setdefault(g, []).append(e)
    return out


def _held(found: list[_Run], v: Verdict, window: float) -> str:
    """Return how long the newest run has lasted and the verdict's share of the time drawn."""
    if not found:
        return ""
    seconds = window / WIDTH
    last = found[-1]
    total = sum(r.x1 - r.x0 for r in found)
    same = sum(r.x1 - r.x0 for r in found if r.verdict.verdict == v.verdict)
    share = f" · {same / total:.0%} of the last {total * seconds:.0f} s" if total > 0 else ""
    return f'<span class="held">for {(last.x1 - last.x0) * seconds:.0f} s{share}</span>'


def gpu_rows(snap: Snapshot, history: Sequence[Snapshot], gpus: Sequence[int], window: float) -> list[str]:
    """Return the grid cells of every shown GPU: who it is and its verdict, the timeline, the evidence."""
    gap = 3 * max(snap.interval, 1e-3) * stride(len(history))  # ticks drawn further apart are missing
    verdicts = {v.gpu: v for v in snap.verdicts}
    engines = _engines_by_gpu(snap.engines)
    found = tracks(history, gpus, window)
    cells: list[str] = []
    for g in gpus:
        v = verdicts.get(g) or Verdict(g, "unknown")
        reading = snap.gpu(g)
        name = clip(reading.name) if reading is not None else "not seen by NVML"
        on = engines.get(g, [])
        driving = " · ".join(f"{clip(e.name)} · {clip(e.model)}" if e.model else clip(e.name) for e in on[:3])
        svg, runs_ = timeline(found[g], window, gap)
        key = colour_key(v)
        reasons = f'<div class="reasons">{reasons_text(v.reasons)}</div>' if v.reasons else ""
        cells.append(
            f'<div class="gpu" id="gpu-{g}" data-gpu="{g}" data-verdict="{escape(v.verdict)}" '
            f'data-reasons="{escape(" ".join(v.reasons))}"><div class="gpu-id">GPU {g}</div>'
            f'<div class="meta" title="{name}">{name}</div>'
            f'<div class="meta" title="{driving}">{driving or "no engine"}</div>'
            f'<span class="verdict{" idle" if key in DARK_TEXT else ""}" style="background:{COLOUR[key]}">'
            f"{VERDICT_TEXT.get(v.verdict, escape(v.verdict))}</span>{_held(runs_, v, window)}{reasons}</div>"
            f"<div>{svg}</div><div>{evidence(v)}</div>"
        )
    return cells


def summary(snap: Snapshot) -> str:
    """Return the counts by verdict now and a headline naming the host-bound GPUs and why."""
    counts: dict[str, int] = {}
    for v in snap.verdicts:
        counts[v.verdict] = counts.get(v.verdict, 0) + 1
    chips = "".join(
        f'<span class="chip {k}" style="background:{COLOUR[k]}">{counts[k]} {VERDICT_TEXT[k]}</span>'
        for k in ("host", "gpu", "unknown", "idle")
        if counts.get(k)
    )
    host = [v for v in snap.verdicts if v.verdict == "host"]
    if host:
        named = "; ".join(f"GPU {v.gpu}: {reasons_text(v.reasons[:2])}" for v in host[:8])
        more = f" and {len(host) - 8} more" if len(host) > 8 else ""
        headline = f'<p class="headline" id="headline"><b>Host-bound now</b> — {named}{more}.</p>'
    elif snap.verdicts:
        headline = '<p class="headline" id="headline">No GPU is host-bound now.</p>'
    else:
        headline = '<p class="headline" id="headline">No GPU verdicts yet.</p>'
    return f'<div class="summary">{chips or "<span>no GPU verdicts</span>"}</div>{headline}'


def legend() -> str:
    """Return the band's colour key."""
    items = [("gpu", "GPU-bound"), ("idle", "idle"), ("unknown", "unknown")]
    items += [(k, f"host: {REASON_TEXT[k[5:]]}") for k in COLOUR if k.startswith("host:")]
    keys = "".join(f'<span><i style="background:{COLOUR[k]}"></i>{t}</span>' for k, t in items)
    return f'<div class="legend">{keys}<span><i style="background:#1c7ed6;height:3px"></i>busy</span></div>'


def engines_table(engines: Sequence[EngineReading]) -> str:
    """Return the engines found: name, kind, model, GPUs, API servers (never a command line)."""
    if not engines:
        return "<p>no engine found</p>"
    rows = "".join(
        f"<tr><td>{clip(e.name)}</td><td>{clip(e.kind)}</td><td>{clip(e.model or '–')}</td>"
        f"<td>{clip(', '.join(map(str, e.gpus)) or '–')}</td><td>{len(e.api_servers)}</td></tr>"
        for e in engines[:MAX_ENGINES]
    )
    more = f'<p class="note">and {len(engines) - MAX_ENGINES} more</p>' if len(engines) > MAX_ENGINES else ""
    return (
        "<table><tr><th>engine</th><th>kind</th><th>model</th><th>GPUs</th><th>API servers</th></tr>"
        f"{rows}</table>{more}"
    )


def source_state(snap: Snapshot, name: str, up: bool) -> str:
    """Return how the page names a source's state ("up" with nothing found is said so)."""
    if not up:
        return "down"
    if name == "engine" and not snap.engines:
        return "no engine found"
    if name == "nvml" and not snap.gpus:
        return "no GPU found"
    return "up"


def sources_list(snap: Snapshot, scrub: Callable[[str], str]) -> str:
    """Return each source's state, with the last error (scrubbed of credentials) of one that is down."""
    items = []
    for s in snap.sources:
        error = "" if s.up else f" <small>{clip(scrub(s.last_error))}</small>"
        items.append(
            f'<li class="{"up" if s.up else "down"}">{escape(s.name)}: {source_state(snap, s.name, s.up)}{error}</li>'
        )
    return f'<ul class="sources">{"".join(items)}</ul>'


def render(
    history: Sequence[Snapshot],
    *,
    version: str,
    window: float,
    now: float,
    stale_after: float,
    banner: str = "",
    refresh_seconds: int = 5,
    max_gpus: int = MAX_GPUS,
    scrub: Callable[[str], str] = str,
) -> str:
    """Return the page for a history of Snapshots (oldest first) at monotonic time `now`."""
    head = (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" '
        f'content="{refresh_seconds}"><title>boundwatch</title><style>{CSS}</style></head><body>'
    )
    top = (
        f"<h1>boundwatch <small>{escape(version)}</small></h1>"
        '<p class="sub">Is each GPU GPU-bound or host-bound, and why.</p>'
        + (f'<p class="banner" id="banner">{escape(banner)}</p>' if banner else "")
    )
    if not history:
        return f"{head}{top}<p>no snapshot yet: the first tick has not finished</p>{_links()}</body></html>"
    snap = history[-1]
    age = now - snap.mono
    stale = (
        f'<p class="stale" id="stale">no new tick for {age:.0f} s: sampling has stalled; what follows is old</p>'
        if age > stale_after
        else ""
    )
    gpus, total = shown_gpus(snap, max_gpus)
    capped = (
        f'<p class="note" id="capped">showing {len(gpus)} of {total} GPUs (host-bound first); '
        "the rest are on /metrics</p>"
        if total > len(gpus)
        else ""
    )
    axis = "".join(f"<span>{ago(window * (4 - k) / 4)}</span>" for k in range(5))
    grid = (
        '<div class="grid"><div class="head">GPU and verdict now</div>'
        f'<div class="head"><div class="axis" style="width:{WIDTH}px">{axis}</div></div><div class="head">evidence now</div>'
        + "".join(gpu_rows(snap, history, gpus, window))
        + "</div>"
        if gpus
        else "<p>no GPU found</p>"
    )
    host = snap.host
    host_line = (
        "–"
        if host is None
        else f"{host.cpus} CPUs" + ("" if host.cpu_busy is None else f", {host.cpu_busy:.0%} busy")
    )
    at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(snap.at))
    return (
        f"{head}{top}{stale}{summary(snap)}{legend()}{capped}{grid}"
        f'<div class="cols"><div><h2>Engines</h2>{engines_table(snap.engines)}</div>'
        f"<div><h2>Host</h2><p>{host_line}</p><h2>Sources</h2>{sources_list(snap, scrub)}</div></div>"
        f"<footer>tick {snap.seq} at {at} · window {window:g} s · refreshes every {refresh_seconds} s · "
        f"{_links()}</footer></body></html>"
    )


def _links() -> str:
    return '<a href="/metrics">/metrics</a> · <a href="/healthz">/healthz</a> · <a href="/api/snapshot">/api/snapshot</a>'
