"""A golden /metrics page: the seed-000 host through the real sampler, pipeline, collectors and web app.

The scene: one H200 at 27% CUPTI busy with 3.4 s of >1 ms idle gaps per 10 s, vLLM running 160
requests with none waiting, its one API server's main thread saturated, in a container with a
0.5-core quota. The page is fetched from the app's /metrics (its per-tick page cache, its HTTP
families), diffed against tests/fixtures/golden/metrics.txt (UPDATE_GOLDEN=1 rewrites it) and must
pass `promtool check metrics`. The process_* families of prometheus_client's ProcessCollector
measure this test's process and are left out.
"""

import dataclasses
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from exporter.config import Config, NvmlConfig
from exporter.sampling import Sampler
from exporter.serve.web import make_app
from exporter.snapshot.agent import AgentReading, AgentState, GpuActivity
from exporter.snapshot.engine import ThreadLoad
from exporter.snapshot.host import CgroupCpu, HostReading, ProcessCpu
from exporter.sources.nvml import NvmlSource
from tests.fakes.clock import Clock
from tests.fakes.engine_reads import reading_from_page
from tests.fakes.nvml_standin import FakeGpu, FakeNvml

HERE = Path(__file__).parent
GOLDEN = HERE / "fixtures" / "golden" / "metrics.txt"
PROMTOOL = shutil.which("promtool")
UUID = "GPU-8f3c0d5e-0000-0000-0000-000000000001"


class Fixed:
    """A source that returns the same reading every tick (the scene is steady)."""

    def __init__(self, name, reading) -> None:
        self.name, self.reading = name, reading

    async def read(self):
        return self.reading

    def close(self) -> None:
        pass


def _scene():
    page = (HERE / "fixtures" / "engine" / "vllm-0.10.0-single-glm45-fragment.prom").read_text()
    quota = CgroupCpu("/kubepods.slice/pod1/ctr", 0.5, 31.25, 41.5, 870, 1200)
    main = ThreadLoad(tid=4700, name="python3", cpu=0.99, runnable=1.0)
    server = ProcessCpu(4700, "VLLM::APIServer_0", ("VLLM::APIServer_0",), 1.02, main, quota.path)
    engine = dataclasses.replace(
        reading_from_page(page, name="vllm:8000", url="http://127.0.0.1:8000/metrics"),
        running=160.0,
        waiting=0.0,
        api_servers=(server,),
        api_server_count=1,
        cgroups=(quota,),
        pids=(4700, 4701),
    )
    half_s = 500_000_000
    gaps = (0, 0, 0, 0, 0, 6, 1, 0, 0, 0, 0)  # 6 gaps of 20-50 ms, 1 of 50-100 ms in 0.5 s
    activity = GpuActivity(
        gpu=0, uuid=UUID, observed_ns=half_s, busy_ns=135_000_000, graph_busy_ns=120_000_000,
        kernels=410, memcpys=12, memsets=3, graphs=7, idle_gap_counts=gaps, idle_gap_sum_ns=170_000_000,
        last_window_busy_ns=135_000_000, last_window_ns=half_s,
    )  # fmt: skip
    agent = AgentReading(
        activity=(activity,),
        agents=(AgentState(pid=4701, gpu=0, state="running", role="vllm_worker", uuid=UUID),),
        messages=1,
    )
    return engine, agent, HostReading(cpus=32, cpu_busy=0.31, own_cgroup=None)


async def _page(aiohttp_client) -> str:
    clock, wall = Clock(1000.0), Clock(1_764_400_000.0)
    engine, agent, host = _scene()
    gpu = FakeGpu(
        uuid=UUID, power_mw=340_000, sm_mhz=1980, reasons=0, util=34, pids=(4701,), gpm={1: 30.0, 2: 28.0}
    )
    sources = [
        NvmlSource(NvmlConfig(), nvml=FakeNvml([gpu]), clock=clock),  # type: ignore[arg-type]
        Fixed("host", host),
        Fixed("engine", (engine,)),
        Fixed("agent", agent),
    ]
    sampler = Sampler(Config(), sources, clock=clock, wall=wall)
    for _ in range(9):
        await sampler.tick()
        clock.t += 0.5
        wall.t += 0.5
    clock.t -= 0.25  # a scrape half-way through a tick
    for s in sources:
        s.close()
    client = await aiohttp_client(make_app(Config(), sampler))
    resp = await client.get("/metrics", headers={"Accept-Encoding": "identity"})
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
    text = await resp.text()
    # Source read durations are wall time and the Python version is the machine's: pin them.
    text = re.sub(r'python="[^"]*"', 'python="3"', text)
    return (
        "\n".join(
            line
            if not line.startswith("boundwatch_source_duration_seconds{")
            else line.rsplit(" ", 1)[0] + " 0.0"
            for line in text.splitlines()
            if not re.match(r"(# (HELP|TYPE) )?process_", line)
        )
        + "\n"
    )


async def test_metrics_page_matches_the_golden_file(aiohttp_client):
    page = await _page(aiohttp_client)
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(page)
    assert page == GOLDEN.read_text(), "the page changed: review, then rerun with UPDATE_GOLDEN=1"


async def test_golden_page_tells_the_seed_story(aiohttp_client):
    page = await _page(aiohttp_client)
    assert 'boundwatch_bound{gpu="0",verdict="host"} 1.0' in page
    assert 'boundwatch_bound_reason{gpu="0",reason="api_server_saturated"} 1.0' in page
    assert 'boundwatch_gpu_busy_ratio{gpu="0",source="cupti"} 0.27' in page


@pytest.mark.prometheus
@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (make test installs it)")
def test_golden_page_passes_promtool_check_metrics():
    result = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=GOLDEN.read_text(), capture_output=True, text=True
    )
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), (
        result.stdout + result.stderr
    )
