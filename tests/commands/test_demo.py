"""`boundwatch demo`: synthetic readings through the real Sampler, pipeline and web app, clearly labelled."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.cli import main
from exporter.commands.demo import PHASES, World, demo_sources, make_demo_app
from exporter.config import Config, load
from exporter.sampling import Sampler
from tests.fakes.clock import Clock


async def _run(world: World, clock: Clock, cfg: Config, seconds: float) -> Sampler:
    sampler = Sampler(cfg, demo_sources(world, cfg), clock=clock)
    end = clock.t + seconds
    while clock.t < end:
        await sampler.tick()
        clock.t += cfg.tick_seconds
    return sampler


@pytest.mark.parametrize(
    ("phase", "verdict", "reason"),
    [
        ("idle", "idle", None),
        ("gpu", "gpu", None),
        ("host", "host", "api_server_saturated"),
        ("quota", "host", "cpu_quota_throttled"),
        ("graph", "host", "cuda_graph_fallback"),
    ],
)
async def test_each_phase_reads_as_the_verdict_code_decides(
    phase: str, verdict: str, reason: str | None
) -> None:
    """Let the real classifier call each phase: the demo sets readings, never verdicts."""
    clock = Clock()
    world = World(gpus=2, order=(phase,), phase_seconds=60, clock=clock)
    sampler = await _run(world, clock, Config(), 5.0)
    snap = sampler.latest()
    assert snap is not None
    assert {v.gpu: v.verdict for v in snap.verdicts} == {0: verdict, 1: verdict}
    for v in snap.verdicts:
        if reason is not None:
            assert reason in v.reasons, v.reasons
        assert v.busy_source == "gpm"
    if phase == "host":  # the saturated server still has requests running (not an empty engine)
        assert all(e.running and e.running > 0 for e in snap.engines)


async def test_gpus_cycle_through_the_phases_and_idle_gpus_stay_idle() -> None:
    """Move each cycling GPU to the next phase every phase_seconds, staggered; extra GPUs stay idle."""
    clock = Clock()
    world = World(gpus=2, idle_gpus=1, phase_seconds=4, clock=clock)
    sampler = Sampler(Config(), demo_sources(world, Config()), clock=clock)
    seen: dict[int, list[str]] = {0: [], 1: [], 2: []}
    for _ in range(int(4 * len(PHASES) / 0.5)):
        snap = await sampler.tick()
        for v in snap.verdicts:
            if not seen[v.gpu] or seen[v.gpu][-1] != v.verdict:
                seen[v.gpu].append(v.verdict)
        clock.t += 0.5
    assert seen[0][:3] == ["idle", "gpu", "host"]
    assert seen[1][0] == "gpu"  # staggered: GPU 1 starts one phase later in the cycle
    assert seen[2] == ["idle"]
    assert world.phase_name(0, world.start + 8.1) == "host"


async def test_an_engine_that_stops_stepping_hands_over_zero_counts_and_reads_idle() -> None:
    """Hand over one last step with running = waiting = 0 when a GPU goes idle, as the real light agent does."""
    clock = Clock()
    world = World(gpus=1, order=("graph", "idle"), phase_seconds=4, stagger=False, clock=clock)
    sampler = Sampler(Config(), demo_sources(world, Config()), clock=clock)
    reported: list[tuple[str, int, float | None, float | None]] = []
    verdicts = []
    for _ in range(16):  # 4 s of graph phase, 4 s of idle
        snap = await sampler.tick()
        assert snap.agent is not None
        phase = world.phase_name(0, clock.t)
        reported += [(phase, s.steps, s.running, s.waiting) for s in snap.agent.steps]
        verdicts.append((phase, snap.verdicts[0].verdict))
        clock.t += 0.5
    idle_steps = [r for r in reported if r[0] == "idle"]
    assert idle_steps == [("idle", 1, 0.0, 0.0)]  # once, with the counts read after the last step
    assert all(r[2] == 300 for r in reported if r[0] == "graph")
    assert verdicts[-1] == ("idle", "idle") and verdicts[7] == ("graph", "host")


async def test_metrics_say_demo_and_carry_the_pipeline_counters(aiohttp_client) -> None:
    """Serve boundwatch_demo 1 beside the real families; the page says DEMO DATA."""
    clock = Clock()
    cfg = Config()
    world = World(gpus=1, order=("host",), clock=clock)
    sampler = await _run(world, clock, cfg, 4.0)
    client = await aiohttp_client(make_demo_app(cfg, sampler))
    text = await (await client.get("/metrics")).text()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert fams["boundwatch_demo"].samples[0].value == 1.0
    bound = {s.labels["verdict"]: s.value for s in fams["boundwatch_bound"].samples}
    assert bound["host"] == 1.0
    host_bound = fams["boundwatch_host_bound_seconds"].samples[0].value
    assert 2.0 < host_bound < 3.5  # ~73% of 3.5 s idle with requests running
    assert {s.labels["source"] for s in fams["boundwatch_source_up"].samples} == {
        "nvml",
        "host",
        "engine",
        "agent",
    }
    page = await (await client.get("/")).text()
    assert "DEMO DATA" in page


async def test_a_source_disabled_by_configuration_is_left_out() -> None:
    """Build no nvml demo source with nvml.enabled = false, so no boundwatch_source_up{source="nvml"} at all."""
    cfg = load(None, overrides={"nvml.enabled": False})
    clock = Clock()
    sampler = await _run(World(gpus=1, order=("host",), clock=clock), clock, cfg, 3.0)
    snap = sampler.latest()
    assert snap is not None
    assert [s.name for s in snap.sources] == ["host", "engine", "agent"]
    assert not snap.gpus


@pytest.mark.parametrize(
    "flags",
    [
        ["--phases", "idle,busy"],
        ["--gpus", "0"],
        ["--phase-seconds", "0"],
        ["--phase-seconds", "nan"],
        ["--seconds", "-1"],
    ],
)
def test_bad_flags_exit_2(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Refuse a phase name that does not exist, no GPUs, or a phase length out of range."""
    assert main(["demo", *flags]) == 2
    assert "demo:" in capsys.readouterr().err


def test_tls_asked_for_is_refused_not_served_as_plain_http(
    tmp_path, monkeypatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo has no TLS listener: where TLS is asked for it says so and serves nothing."""
    trustme = pytest.importorskip("trustme")
    cert = trustme.CA().issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "c.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "k.pem"))
    web = tmp_path / "web.yml"
    web.write_text("tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n")
    assert main(["demo", "--web.config.file", str(web), "--seconds", "1"]) == 2
    monkeypatch.setenv("BOUNDWATCH_WEB__TLS_CERT_FILE", str(tmp_path / "c.pem"))
    monkeypatch.setenv("BOUNDWATCH_WEB__TLS_KEY_FILE", str(tmp_path / "k.pem"))
    assert main(["demo", "--seconds", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("demo: serves plain HTTP only (no TLS)") == 2
