"""The status page: per-GPU verdict timelines with reasons and evidence, escaped, bounded, cached per tick."""

from __future__ import annotations

import dataclasses
import gzip
import random
import re

from exporter.commands.demo import World, demo_sources, make_demo_app
from exporter.config import Config
from exporter.logs import scrub
from exporter.sampling import Sampler
from exporter.serve import statuspage, web
from exporter.serve.statuspage import BUSY_H, BUSY_TOP, MAX_COLUMNS, WIDTH
from exporter.snapshot import Snapshot, SourceStatus
from exporter.snapshot.engine import EngineReading
from exporter.snapshot.host import ProcessCpu
from exporter.snapshot.verdict import Verdict
from tests.fakes.clock import Clock
from tests.fakes.pagedom import Node, parse


async def _demo(world: World, clock: Clock, seconds: float, cfg: Config | None = None) -> Sampler:
    cfg = cfg or Config()
    sampler = Sampler(cfg, demo_sources(world, cfg), clock=clock)
    end = clock.t + seconds
    while clock.t < end:
        await sampler.tick()
        clock.t += cfg.tick_seconds
    return sampler


def _render(history, now: float, **kw) -> Node:
    kw.setdefault("window", 120.0)
    return parse(statuspage.render(history, version="t", now=now, stale_after=5.0, **kw))


def _segments(row_svg: Node) -> list[tuple[str, float, float, str]]:
    """Return the band's runs: (verdict, x, width, title)."""
    return [
        (r.attrs["data-verdict"], float(r.attrs["x"]), float(r.attrs["width"]), r.text())
        for r in row_svg.find_all("rect", "seg")
    ]


async def test_each_gpu_shows_its_verdict_reasons_and_the_evidence_behind_them() -> None:
    """GPU i starts in phase i: idle, gpu, host (API server), quota, graph; each reads as the classifier said."""
    clock = Clock()
    sampler = await _demo(World(gpus=5, phase_seconds=60, clock=clock), clock, 10.0)
    snap = sampler.latest()
    assert snap is not None
    dom = _render(sampler.history(), clock.t)
    rows = {int(r.attrs["data-gpu"]): r for r in dom.find_all("div", "gpu")}
    assert sorted(rows) == [0, 1, 2, 3, 4]
    assert [rows[g].attrs["data-verdict"] for g in range(5)] == [v.verdict for v in snap.verdicts]
    assert [rows[g].attrs["data-verdict"] for g in range(5)] == ["idle", "gpu", "host", "host", "host"]
    first = [rows[g].attrs["data-reasons"].split()[0] for g in (2, 3, 4)]
    assert first == ["api_server_saturated", "cpu_quota_throttled", "cuda_graph_fallback"]
    assert "API server saturated" in rows[2].find("div", "reasons").text()
    assert rows[2].find("span", "verdict").text() == "host-bound"
    assert rows[1].find("span", "verdict").text() == "GPU-bound"

    cells = [c for c in dom.find("div", "grid").children if isinstance(c, Node)]

    def evidence(g: int) -> dict[str, tuple[str, bool]]:
        """Return the GPU's evidence (its row's third cell): text and whether it is highlighted."""
        dl = cells[cells.index(rows[g]) + 2].find("dl", "evidence")
        return {
            dd.attrs["data-evidence"]: (dd.text(), "hot" in dd.attrs.get("class", ""))
            for dd in dl.find_all("dd")
        }

    api = evidence(2)
    assert re.fullmatch(r"busiest thread (0\.9\d|1\.0\d) core", api["api"][0]) and api["api"][1]
    assert api["busy"][0].endswith("(gpm)") and api["busy"][1]
    assert api["queue"][0].endswith("· 0 waiting")
    quota = evidence(3)
    assert quota["quota"][1] and "of periods throttled (quota 6 cores)" in quota["quota"][0]
    assert not quota["api"][1]
    graphs = evidence(4)
    assert graphs["graphs"][1] and graphs["graphs"][0] == "12% of busy time"
    gpu = evidence(1)
    assert not any(hot for _, hot in gpu.values())  # nothing to blame on a GPU-bound GPU
    assert re.fullmatch(r"\d+ W of 700 W", gpu["power"][0])
    headline = dom.find(id="headline").text()
    assert headline.startswith("Host-bound now") and "GPU 2: API server saturated" in headline
    chips = [c.text() for c in dom.find_all("span", "chip")]
    assert chips == ["3 host-bound", "1 GPU-bound", "1 idle"]


async def test_the_timeline_draws_each_phase_in_order_with_its_reason_and_busy_line() -> None:
    """60 s of idle, GPU-bound, host-bound (20 s each) fill the right half of a 120 s window, in order."""
    clock = Clock()
    world = World(gpus=1, order=("idle", "gpu", "host"), phase_seconds=20, stagger=False, clock=clock)
    sampler = await _demo(world, clock, 60.0)
    dom = _render(sampler.history(), clock.t)
    svg = dom.find("svg", "timeline")
    segs = _segments(svg)
    assert [s[0] for s in segs] == ["idle", "gpu", "host"]
    px_per_s = WIDTH / 120
    assert abs(segs[0][1] - WIDTH / 2) < 2 * px_per_s  # the history starts 60 s ago: mid-window
    for verdict, _, width, _ in segs[:2]:  # the last run ends now, shortened by the verdict's window
        assert abs(width - 20 * px_per_s) < 3 * px_per_s, (verdict, width)
    assert segs[2][3].startswith("host-bound: API server saturated")
    assert segs[1][3].startswith("GPU-bound (")
    labels = [t.text() for t in svg.find_all("text") if not t.text().endswith("%")]
    assert labels == ["idle", "GPU-bound", "API server"]  # 20 s is too narrow for "API server saturated"
    path = svg.find("path", "busy").attrs["d"]
    points = [tuple(map(float, p.split())) for p in re.findall(r"[ML]([\d.]+ [\d.]+)", path)]
    assert path.count("M") == 1 and len(points) == len(sampler.history())
    bottom = BUSY_TOP + BUSY_H
    busy_at = [(x, (bottom - y) / BUSY_H) for x, y in points]
    edge = [WIDTH / 2 + k * 20 * px_per_s for k in (1, 2)]  # the phases change here; the band follows later
    assert all(b == 0 for x, b in busy_at if x < edge[0] - 1)  # idle
    assert all(0.9 < b <= 1.0 for x, b in busy_at if edge[0] + 3 < x < edge[1] - 1)
    assert all(0.2 < b < 0.35 for x, b in busy_at if x > edge[1] + 3)  # 27% busy, host-bound
    assert edge[0] <= segs[1][1] < edge[0] + 3 * px_per_s  # the verdict lags the readings by its window


def _snap(seq: int, mono: float, verdicts: tuple[Verdict, ...], **kw) -> Snapshot:
    return Snapshot(seq=seq, at=1.7e9 + mono, mono=mono, interval=0.5, dt=0.5, verdicts=verdicts, **kw)


def test_missing_ticks_break_the_line_and_the_band() -> None:
    """A 10 s stall draws as a hole, not as a verdict that held through it."""
    history = [_snap(i, i * 0.5, (Verdict(0, "gpu", busy_ratio=0.95),)) for i in range(20)]
    history += [_snap(20 + i, 20.0 + i * 0.5, (Verdict(0, "gpu", busy_ratio=0.95),)) for i in range(20)]
    svg = _render(history, 30.0, window=30.0).find("svg", "timeline")
    segs = _segments(svg)
    assert [s[0] for s in segs] == ["gpu", "gpu"]
    assert segs[0][1] + segs[0][2] < segs[1][1] - 5 * WIDTH / 30  # most of the 10 s left empty
    assert svg.find("path", "busy").attrs["d"].count("M") == 2


def test_text_from_outside_is_escaped_and_command_lines_never_shown() -> None:
    """GPU, engine and model names and source errors come from outside: escaped; no command line, no credentials."""
    hostile = "<script>alert(1)</script>"
    server = ProcessCpu(
        pid=7,
        name="vllm",
        cmdline=("vllm", "serve", "--api-key", "sk-secret-1"),
        cpu=1.0,
        busiest_thread=None,
    )
    engine = EngineReading(
        name='e"><img src=x onerror=alert(2)>',
        kind="vllm",
        model="</svg><b>model</b>",
        url="http://user:pw@127.0.0.1:1/metrics",
        api_servers=(server,),
        gpus=(0,),
    )
    verdict = Verdict(0, "host", ("api_server_saturated",), 0.3, "<i>src</i>")
    history = [
        _snap(
            i,
            i * 0.5,
            (verdict,),
            engines=(engine,),
            sources=(SourceStatus("engine", False, 1, "GET http://user:pw@10.0.0.1/metrics: <b>503</b>"),),
        )
        for i in range(4)
    ]
    from exporter.snapshot.gpu import GpuReading

    history = [dataclasses.replace(s, gpus=(GpuReading(0, "GPU-x", hostile, "1"),)) for s in history]
    page = statuspage.render(history, version="<v>", window=120, now=2.0, stale_after=5, scrub=scrub)
    assert "<script" not in page and "<img" not in page and "<b>model" not in page and "<i>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;/svg&gt;&lt;b&gt;model" in page
    assert "sk-secret-1" not in page and "--api-key" not in page and "vllm serve" not in page
    assert "pw@" not in page and "http://10.0.0.1/metrics" in page
    dom = parse(page)
    row = dom.find("div", "gpu")
    assert hostile in row.text()  # shown as text
    assert dom.find("svg", "timeline") is not None  # the hostile model did not close the SVG


def test_the_page_is_self_contained_and_refreshes_itself() -> None:
    """No script, stylesheet, image or font from anywhere; a meta refresh; only the exporter's own links."""
    history = [_snap(i, i * 0.5, (Verdict(0, "gpu", busy_ratio=0.9),)) for i in range(10)]
    page = statuspage.render(history, version="t", window=120, now=5.0, stale_after=5, refresh_seconds=3)
    dom = parse(page)
    assert not dom.find_all("script") and not dom.find_all("link") and not dom.find_all("img")
    assert "url(" not in page and "@import" not in page and "src=" not in page
    assert {a.attrs["href"] for a in dom.find_all("a")} == {"/metrics", "/healthz", "/api/snapshot"}
    assert dom.find("meta", http_equiv="refresh").attrs["content"] == "3"
    assert len(dom.find_all("style")) == 1


async def test_many_gpus_are_capped_with_a_note_host_bound_first() -> None:
    """40 GPUs show 16 rows: the 3 host-bound ones, then the lowest indices; a note says so."""
    clock = Clock()
    world = World(gpus=3, idle_gpus=37, order=("host",), clock=clock)
    sampler = await _demo(world, clock, 4.0)
    dom = _render(sampler.history(), clock.t)
    rows = [int(r.attrs["data-gpu"]) for r in dom.find_all("div", "gpu")]
    assert rows == list(range(16))
    assert "showing 16 of 40 GPUs" in dom.find(id="capped").text()
    history = [_snap(1, 0.0, tuple(Verdict(g, "host" if g in (30, 39) else "idle") for g in range(40)))]
    rows = [int(r.attrs["data-gpu"]) for r in _render(history, 0.0).find_all("div", "gpu")]
    assert rows == [*range(14), 30, 39]


def test_a_long_flapping_history_stays_bounded() -> None:
    """3,000 ticks of 16 GPUs flapping at random draw at most MAX_COLUMNS runs and points per GPU, no holes."""
    rng = random.Random(5)
    history = []
    for i in range(3000):
        verdicts = tuple(
            Verdict(g, rng.choice(("gpu", "idle", "host")), busy_ratio=rng.random()) for g in range(16)
        )
        history.append(_snap(i, i * 0.5, verdicts))
    page = statuspage.render(history, version="t", window=1500, now=1499.5, stale_after=5)
    dom = parse(page)
    svgs = dom.find_all("svg", "timeline")
    assert len(svgs) == 16
    for svg in svgs:
        segs = _segments(svg)
        assert 100 < len(segs) <= MAX_COLUMNS  # it still flaps after sampling down
        assert sum(width for _, _, width, _ in segs) > 0.99 * WIDTH  # sampled ticks are not taken for gaps
        path = svg.find("path", "busy").attrs["d"]
        assert path.count("M") == 1 and path.count("L") == MAX_COLUMNS - 1
    assert len(page) < 500_000, len(page)


async def test_the_page_is_rendered_once_per_tick_gzipped_once_and_says_when_stale(aiohttp_client) -> None:
    """Many views in one tick cost one render; a new tick renders anew; a stalled sampler is said to be."""
    clock = Clock()
    cfg = Config()
    sampler = await _demo(World(gpus=2, clock=clock), clock, 3.0)
    client = await aiohttp_client(make_demo_app(cfg, sampler))
    cache = client.app[web.STATUS_PAGE]
    pages = {await (await client.get("/")).text() for _ in range(10)}
    assert len(pages) == 1 and cache.renders == 1
    page = pages.pop()
    assert "DEMO DATA" in parse(page).find(id="banner").text()
    for _ in range(3):
        resp = await client.get("/", headers={"Accept-Encoding": "gzip"}, auto_decompress=False)
        assert resp.headers["Content-Encoding"] == "gzip"
        assert resp.headers["Content-Type"] == "text/html; charset=utf-8"
        assert gzip.decompress(await resp.read()).decode() == page
    assert cache.renders == 1 and cache.compressions == 1
    await sampler.tick()
    clock.t += cfg.tick_seconds
    await client.get("/")
    assert cache.renders == 2
    clock.t += 30.0  # no tick for 30 s
    stale = parse(await (await client.get("/")).text())
    assert "sampling has stalled" in stale.find(id="stale").text()
    assert client.app[web.PAGES].renders == 0  # /metrics' own cache untouched


def test_no_snapshot_yet_says_so() -> None:
    """Before the first tick the page says it is waiting, with the links."""
    dom = parse(statuspage.render((), version="t", window=120, now=0, stale_after=5))
    assert "no snapshot yet" in dom.text() and dom.find_all("a")


def test_a_busy_share_estimated_from_sm_says_so_beside_its_source():
    read = Verdict(0, "gpu", (), 0.94, "gpm", (("busy", 0.94),))
    estimated = dataclasses.replace(read, evidence=(("busy", 0.94), ("busy_estimated", 1.0)))
    assert "94% (gpm)" in statuspage.evidence(read) and "estimated" not in statuspage.evidence(read)
    assert "94% (gpm, estimated from SM)" in statuspage.evidence(estimated)
