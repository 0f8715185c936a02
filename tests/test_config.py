"""Configuration layering (defaults < TOML < environment < flags), validation and the CLI check."""

import json

import pytest

from exporter.cli import main
from exporter.config import DEFAULT_PORT, ConfigError, load


def test_defaults_run_anywhere():
    cfg = load(environ={})
    assert cfg.web.port == DEFAULT_PORT != 9400
    assert cfg.tick_seconds == 0.5
    assert cfg.nvml.enabled and cfg.engine.enabled and cfg.agent.enabled


def test_toml_then_environment_then_flags_win_in_order(tmp_path):
    toml = tmp_path / "bw.toml"
    toml.write_text(
        'tick_seconds = 0.25\n[web]\nport = 9100\naddress = "127.0.0.1"\n[engine]\nurls = ["http://127.0.0.1:8000/metrics"]\n'
    )
    env = {
        "BOUNDWATCH_WEB__PORT": "9200",
        "BOUNDWATCH_VERDICT__BUSY_LOW": "0.5",
        "BOUNDWATCH_NVML__ENABLED": "false",
    }
    cfg = load(str(toml), environ=env, overrides={"web.port": 9300})
    assert cfg.tick_seconds == 0.25
    assert cfg.web.address == "127.0.0.1"
    assert cfg.web.port == 9300
    assert cfg.verdict.busy_low == 0.5
    assert cfg.nvml.enabled is False
    assert cfg.engine.urls == ("http://127.0.0.1:8000/metrics",)


def test_env_list_is_comma_separated():
    cfg = load(
        environ={"BOUNDWATCH_ENGINE__URLS": "http://127.0.0.1:8000/metrics, http://127.0.0.1:30000/metrics"}
    )
    assert cfg.engine.urls == ("http://127.0.0.1:8000/metrics", "http://127.0.0.1:30000/metrics")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"BOUNDWATCH_TICK_SECONDS": "0"}, "tick_seconds"),
        ({"BOUNDWATCH_WEB__PORT": "http"}, "web.port"),
        ({"BOUNDWATCH_NO_SUCH_KEY": "1"}, "unknown configuration key"),
        ({"BOUNDWATCH_NVML__ENABLED": "maybe"}, "boolean"),
        ({"BOUNDWATCH_VERDICT__BUSY_LOW": "0.9", "BOUNDWATCH_VERDICT__BUSY_HIGH": "0.5"}, "busy_low"),
        ({"BOUNDWATCH_ENGINE__URLS": "ftp://x"}, "engine.urls"),
        ({"BOUNDWATCH_NVML__GPM_EVERY_TICKS": "0"}, "nvml.gpm_every_ticks"),
        ({"BOUNDWATCH_NVML__GPM_EVERY_TICKS": "21"}, "nvml.gpm_every_ticks"),
        ({"BOUNDWATCH_NVML__GPM_GRAPHICS": "sometimes"}, "nvml.gpm_graphics"),
        (
            {"BOUNDWATCH_HISTORY_SECONDS": "1e30"},
            "history_seconds",
        ),  # the Sampler's deque raised OverflowError
        ({"BOUNDWATCH_HISTORY_SECONDS": "3601"}, "history_seconds"),
    ],
)
def test_bad_configuration_names_the_key(env, message):
    with pytest.raises(ConfigError, match=message):
        load(environ=env)


def test_gpm_graphics_is_on_by_default_and_turned_off_from_the_environment():
    assert load(environ={}).nvml.gpm_graphics is True
    assert load(environ={"BOUNDWATCH_NVML__GPM_GRAPHICS": "false"}).nvml.gpm_graphics is False


def test_missing_config_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load(str(tmp_path / "nope.toml"), environ={})


def test_check_config_prints_the_effective_configuration(capsys, monkeypatch):
    monkeypatch.setenv("BOUNDWATCH_WEB__PORT", "9555")
    assert main(["--check-config", "--tick", "0.25"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["web"]["port"] == 9555 and out["tick_seconds"] == 0.25


def test_check_config_exits_2_on_a_bad_value(capsys):
    assert main(["--check-config", "--tick", "-1"]) == 2
    assert "tick_seconds" in capsys.readouterr().err


def test_agent_section_is_read_from_the_environment_but_the_agents_own_variables_are_not():
    env = {
        "BOUNDWATCH_AGENT__SOCKET": "/run/x/agent.sock",
        "BOUNDWATCH_AGENT_SAMPLING": "auto",
        "BOUNDWATCH_AGENT": "1",
    }
    cfg = load(environ=env)
    assert cfg.agent.socket == "/run/x/agent.sock"


def test_flags_before_and_after_the_run_command_both_count(capsys):
    assert main(["--port", "9111", "run", "--tick", "0.25", "--check-config"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["web"]["port"] == 9111 and out["tick_seconds"] == 0.25


def test_a_slower_tick_needs_no_other_change():
    cfg = load(environ={}, overrides={"tick_seconds": 1.0})
    assert cfg.tick_seconds == 1.0 and cfg.verdict.busy_window_seconds < cfg.tick_seconds  # one tick then
