"""The pipeline's own steps: which GPUs an engine drives, and the busy source it prefers."""

from exporter.analysis.pipeline import pick_busy, resolve_engine_gpus
from exporter.snapshot.engine import EngineReading
from exporter.snapshot.gpu import GpmRatios, GpuReading
from tests.fakes.snapshots import first_tick


def _gpu(i, pids=(), util=None, gpm=None):
    return GpuReading(
        index=i, uuid=f"GPU-{i}aaa", name="NVIDIA H200", driver="580", pids=pids, utilization=util, gpm=gpm
    )


def _snap(gpus, engines):
    return first_tick(gpus=tuple(gpus), engines=tuple(engines))


def test_engine_drives_the_gpus_its_processes_run_on():
    snap = _snap(
        [_gpu(0, pids=(4701,)), _gpu(1, pids=(4702,)), _gpu(2, pids=(999,))],
        [EngineReading(name="vllm:8000", kind="vllm", pids=(4700, 4701, 4702))],
    )
    assert resolve_engine_gpus(snap).engines[0].gpus == (0, 1)


def test_cuda_visible_devices_is_the_fallback_by_index_or_uuid():
    gpus = [_gpu(0), _gpu(1), _gpu(2)]
    by_index = _snap(gpus, [EngineReading(name="a", kind="vllm", cuda_visible_devices="2,1")])
    by_uuid = _snap(gpus, [EngineReading(name="b", kind="sglang", cuda_visible_devices="GPU-1")])
    assert resolve_engine_gpus(by_index).engines[0].gpus == (1, 2)
    assert resolve_engine_gpus(by_uuid).engines[0].gpus == (1,)
    # an engine's environment is its own to write: digits int() refuses are no GPU, not a failed tick
    odd = _snap(
        gpus, [EngineReading(name="c", kind="vllm", cuda_visible_devices="\u00b2," + "9" * 5000 + ",0")]
    )
    assert resolve_engine_gpus(odd).engines[0].gpus == (0,)


def test_engine_that_cannot_be_placed_stays_unplaced():
    snap = _snap([_gpu(0), _gpu(1)], [EngineReading(name="vllm:8000", kind="vllm")])
    assert resolve_engine_gpus(snap).engines[0].gpus == ()


def test_busy_prefers_gpm_over_nvml_utilization():
    snap = _snap([_gpu(0, util=1.0, gpm=GpmRatios(graphics=0.27, sm=0.26)), _gpu(1, util=0.5)], [])
    assert pick_busy(snap) == {0: (0.27, "gpm"), 1: (0.5, "nvml")}


def test_gpu_indices_give_each_uuid_its_gpu_index():
    from exporter.analysis.pipeline import gpu_index, gpu_indices

    snap = first_tick(
        gpus=(_gpu(0), _gpu(3), _gpu(1)),
        gpu_uuids=("MIG-a", "GPU-1aaa", "MIG-b", "MIG-a"),  # one NVML's, one twice
    )
    # NVML's indices for its UUIDs; past its highest (3) each other UUID's first place in gpu_uuids
    expected = {"GPU-0aaa": 0, "GPU-3aaa": 3, "GPU-1aaa": 1, "MIG-a": 4, "MIG-b": 6}
    assert gpu_indices(snap) == expected
    for uuid in (*expected, "GPU-9"):
        assert gpu_index(snap, uuid) == expected.get(uuid)


def test_engines_that_come_and_go_keep_the_counters_of_64_at_most():
    from exporter.analysis.pipeline import advance
    from exporter.config import Config
    from exporter.snapshot import Snapshot
    from exporter.snapshot.totals import MAX_ENGINE_NAMES

    history: list[Snapshot] = []
    for i in range(100):  # one engine serving throughout; beside it a new one each tick (a new port)
        engines = (EngineReading("vllm:8000", "vllm", running=2.0), EngineReading(f"vllm:{9000 + i}", "vllm"))
        raw = Snapshot(
            seq=i + 1, at=i * 0.5, mono=i * 0.5, interval=0.5, dt=0.5 if i else 0.0, engines=engines
        )
        history.append(advance(history, raw, Config()))
    totals = history[-1].totals.engine
    names = {key.engine for key in totals.page_refused}
    assert len(names) == MAX_ENGINE_NAMES == 64
    assert {"vllm:8000", "vllm:9099"} <= names and "vllm:9000" not in names  # the first gone go first
    assert set(totals.running_request_seconds) <= names
    assert totals.running_request_seconds["vllm:8000"] == 2.0 * 0.5 * 99  # its counter never restarted


def test_an_api_server_retitled_each_tick_keeps_its_engine_at_64_server_series():
    from exporter.analysis.pipeline import advance
    from exporter.config import Config
    from exporter.snapshot import Snapshot
    from exporter.snapshot.host import ProcessCpu
    from exporter.snapshot.totals import MAX_SERVERS_PER_ENGINE, EngineServer

    def server(index: int) -> ProcessCpu:
        title = f"VLLM::APIServer_{index}"
        return ProcessCpu(pid=100 + index, name=title, cmdline=(title,), cpu=0.0, busiest_thread=None)

    history: list[Snapshot] = []
    for i in range(150):  # server 0 stays; the other sets its title to a new index each tick
        engine = EngineReading("vllm:8000", "vllm", running=1.0, api_servers=(server(0), server(1 + i)))
        raw = Snapshot(
            seq=i + 1, at=i * 0.5, mono=i * 0.5, interval=0.5, dt=0.5 if i else 0.0, engines=(engine,)
        )
        history.append(advance(history, raw, Config()))
    saturated = history[-1].totals.engine.api_server_saturated_seconds
    assert len(saturated) == MAX_SERVERS_PER_ENGINE == 64
    assert {EngineServer("vllm:8000", "0"), EngineServer("vllm:8000", "150")} <= set(saturated)
