"""The HTTP app: /metrics in both formats, /healthz, the status page, basic auth, stale snapshots."""

import base64
import hashlib

from prometheus_client.parser import text_string_to_metric_families

from exporter.config import Config, NvmlConfig, WebConfig
from exporter.sampling import Sampler
from exporter.serve.web import make_app
from exporter.sources.nvml import NvmlSource
from tests.fakes.clock import Clock
from tests.fakes.nvml_standin import FakeNvml


async def _client(aiohttp_client, cfg=None, clock=None):
    cfg = cfg or Config()
    clock = clock or Clock(50.0)
    sampler = Sampler(cfg, [NvmlSource(NvmlConfig(), nvml=FakeNvml())], clock=clock)  # type: ignore[arg-type]
    await sampler.tick()
    clock.t += 0.5
    await sampler.tick()
    return await aiohttp_client(make_app(cfg, sampler)), sampler


async def test_metrics_serve_gpu_families_in_text_format(aiohttp_client):
    client, _ = await _client(aiohttp_client)
    resp = await client.get("/metrics")
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/plain")
    fams = {f.name: f for f in text_string_to_metric_families(await resp.text())}
    assert fams["boundwatch_gpu_power_watts"].samples[0].value == 695.0
    assert fams["boundwatch_build_info"].samples[0].value == 1.0
    assert {s.labels["source"]: s.value for s in fams["boundwatch_source_up"].samples} == {"nvml": 1.0}


async def test_metrics_negotiate_openmetrics(aiohttp_client):
    client, _ = await _client(aiohttp_client)
    resp = await client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    text = await resp.text()
    assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
    assert text.rstrip().endswith("# EOF")


async def test_healthz_is_ok_while_fresh_and_503_when_ticks_stop(aiohttp_client):
    clock = Clock(50.0)
    client, _ = await _client(aiohttp_client, clock=clock)
    assert (await client.get("/healthz")).status == 200
    clock.t += 60
    assert (await client.get("/healthz")).status == 503


async def test_stale_snapshot_is_not_served_as_fresh(aiohttp_client):
    clock = Clock(50.0)
    client, _ = await _client(aiohttp_client, clock=clock)
    clock.t += 60
    text = await (await client.get("/metrics")).text()
    assert "boundwatch_build_info" in text
    assert "boundwatch_gpu_power_watts" not in text


async def test_status_page_and_snapshot_json(aiohttp_client):
    client, _ = await _client(aiohttp_client)
    page = await (await client.get("/")).text()
    assert "boundwatch" in page and "/metrics" in page and "nvml: up" in page
    data = await (await client.get("/api/snapshot")).json()
    assert data["gpus"][0]["name"] == "NVIDIA H200"


async def test_status_page_says_no_engine_found_when_the_engine_source_found_none(aiohttp_client):
    class NoEngines:
        name = "engine"

        async def read(self):
            return ()

        def close(self) -> None:
            pass

    clock = Clock(50.0)
    sampler = Sampler(Config(), [NoEngines()], clock=clock)  # type: ignore[list-item]
    await sampler.tick()
    client = await aiohttp_client(make_app(Config(), sampler))
    page = await (await client.get("/")).text()
    assert "engine: no engine found" in page and "engine: up" not in page


async def test_basic_auth_guards_everything_but_healthz(aiohttp_client, tmp_path):
    users = tmp_path / "users"
    users.write_text(f"# operators\nprom:{hashlib.sha256(b's3cret').hexdigest()}\n")
    cfg = Config(web=WebConfig(basic_auth_file=str(users)))
    client, _ = await _client(aiohttp_client, cfg=cfg)
    assert (await client.get("/metrics")).status == 401
    bad = base64.b64encode(b"prom:wrong").decode()
    assert (await client.get("/metrics", headers={"Authorization": f"Basic {bad}"})).status == 401
    good = base64.b64encode(b"prom:s3cret").decode()
    assert (await client.get("/metrics", headers={"Authorization": f"Basic {good}"})).status == 200
    assert (await client.get("/healthz")).status == 200


async def test_bcrypt_basic_auth_as_htpasswd_writes_it(aiohttp_client, tmp_path):
    import bcrypt

    users = tmp_path / "users"
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    users.write_text(f"prom:{hashed}\nops:{hashlib.sha256(b'other').hexdigest()}\n")
    cfg = Config(web=WebConfig(basic_auth_file=str(users)))
    client, _ = await _client(aiohttp_client, cfg=cfg)

    def basic(creds: bytes) -> dict[str, str]:
        return {"Authorization": "Basic " + base64.b64encode(creds).decode()}

    assert (await client.get("/metrics", headers=basic(b"prom:wrong"))).status == 401
    for _ in range(2):  # checked once with bcrypt, then remembered: both answers must be the same
        assert (await client.get("/metrics", headers=basic(b"prom:s3cret"))).status == 200
    assert (await client.get("/metrics", headers=basic(b"prom:wrong"))).status == 401  # not remembered
    assert (await client.get("/metrics", headers=basic(b"ops:other"))).status == 200
    assert (await client.get("/metrics", headers=basic(b"ops:s3cret"))).status == 401


def test_basic_auth_file_names_the_formats_it_takes(tmp_path):
    import pytest

    from exporter.webconfig import WebConfigError, load_users_file

    bad = tmp_path / "users"
    bad.write_text("# users\nprom:plaintext-password\n\nops:$2b$99$" + "a" * 53 + "\n")
    with pytest.raises(WebConfigError) as err:
        load_users_file(str(bad))
    assert [p.split(": ", 1)[1] for p in err.value.problems] == [
        "line 2: expected user:bcrypt-hash (cost 04-31) or user:sha256-hex",
        "line 4: expected user:bcrypt-hash (cost 04-31) or user:sha256-hex",  # a cost bcrypt refuses
    ]
    assert "plaintext-password" not in str(err.value)  # a password written by mistake is never echoed
    with pytest.raises(WebConfigError, match="cannot read it"):
        load_users_file(str(tmp_path / "missing"))
