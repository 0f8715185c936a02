"""Typed configuration: every bad key and value is reported, each with the file, variable or flag it came from."""

import json

import pytest

from exporter.cli import main
from exporter.config import ConfigError, load


def _problems(*args, **kwargs) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(*args, **kwargs)
    return info.value.problems


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[web]\nport = 9482.5\n", "web.port = 9482.5: expected an integer"),
        ("[web]\nport = 0.5\n", "web.port = 0.5: expected an integer"),
        ("[web]\naddress = 5\n", "web.address = 5: expected a string"),
        ("[nvml]\nenabled = 1\n", "nvml.enabled = 1: expected a boolean"),
        ('tick_seconds = "fast"\n', "tick_seconds = 'fast': expected a number"),
        ("[engine]\nurls = 5\n", "engine.urls = 5: expected a list of strings"),
        ("[web]\nport = true\n", "web.port = True: expected an integer"),
        ("[web.port]\nx = 1\n", "web.port is a value, not a section"),
        ("web = 1\n", "web: is a section, not a value"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_with_its_file(tmp_path, toml, message):
    path = tmp_path / "bw.toml"
    path.write_text(toml)
    assert any(p.startswith(f"{path}: ") and message in p for p in _problems(str(path), environ={}))


def test_every_bad_key_and_value_is_reported_with_its_origin(tmp_path):
    path = tmp_path / "bw.toml"
    path.write_text("tick = 1\n[web]\nport = 9482.5\nadress = '::1'\n[verdict]\nbusy_high = 2\n")
    env = {"BOUNDWATCH_WEB__MAX_CONNECTIONS": "many", "BOUNDWATCH_NVML__NO_SUCH": "1"}
    problems = _problems(
        str(path), environ=env, overrides={"tick_seconds": 0.0}, override_origins={"tick_seconds": "--tick"}
    )
    assert f"{path}: tick: unknown configuration key" in problems
    assert f"{path}: web.port = 9482.5: expected an integer" in problems
    assert f"{path}: web.adress: unknown configuration key (did you mean web.address?)" in problems
    assert "BOUNDWATCH_WEB__MAX_CONNECTIONS: web.max_connections = 'many': expected an integer" in problems
    assert "BOUNDWATCH_NVML__NO_SUCH: nvml.no_such: unknown configuration key" in problems
    assert "--tick: tick_seconds: must be in [0.05, 60], got 0.0" in problems
    assert any(p.startswith("default: verdict.busy_low") for p in problems)  # busy_high=2 breaks the pair
    assert len(problems) == 7


def test_environment_strings_are_parsed_to_the_field_type():
    cfg = load(
        environ={
            "BOUNDWATCH_WEB__PORT": "9100",
            "BOUNDWATCH_NVML__GPM": "off",
            "BOUNDWATCH_VERDICT__MAX_BATCH": "none",
        }
    )
    assert cfg.web.port == 9100 and cfg.nvml.gpm is False and cfg.verdict.max_batch is None
    assert "expected an integer" in _problems(environ={"BOUNDWATCH_WEB__PORT": "9482.5"})[0]
    assert "finite" in _problems(environ={"BOUNDWATCH_TICK_SECONDS": "nan"})[0]


def test_an_integer_is_a_valid_float_in_toml(tmp_path):
    path = tmp_path / "bw.toml"
    path.write_text("tick_seconds = 1\n[probe]\nduty = [0.25, 0.75]\n")
    cfg = load(str(path), environ={})
    assert cfg.tick_seconds == 1.0 and isinstance(cfg.tick_seconds, float)
    assert cfg.probe.duty == (0.25, 0.75)


def test_check_config_lists_every_problem_and_exits_2(tmp_path, capsys):
    path = tmp_path / "bw.toml"
    path.write_text("[web]\nport = 9482.5\naddress = 5\n")
    assert main(["--config", str(path), "--check-config"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"boundwatch: configuration error: {path}: web.port = 9482.5: expected an integer",
        f"boundwatch: configuration error: {path}: web.address = 5: expected a string",
    ]


def test_check_config_names_the_flag(capsys):
    assert main(["--check-config", "--port", "70000"]) == 2
    assert "--port: web.port: must be 0-65535, got 70000" in capsys.readouterr().err


def test_precedence_still_defaults_toml_env_flags(tmp_path, capsys):
    path = tmp_path / "bw.toml"
    path.write_text("[web]\nport = 9100\nheader_timeout_seconds = 3\n")
    assert main(["--config", str(path), "--check-config"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["web"]["port"] == 9100 and out["web"]["header_timeout_seconds"] == 3.0


def test_the_slow_page_period_is_a_checked_number_of_seconds(tmp_path):
    path = tmp_path / "bw.toml"
    path.write_text("[engine]\nslow_read_seconds = 15\n")
    assert load(str(path), environ={}).engine.slow_read_seconds == 15.0
    assert load(environ={"BOUNDWATCH_ENGINE__SLOW_READ_SECONDS": "0"}).engine.slow_read_seconds == 0.0
    for bad in ("-1", "301"):
        (problem,) = _problems(environ={"BOUNDWATCH_ENGINE__SLOW_READ_SECONDS": bad})
        assert "engine.slow_read_seconds: must be between 0 and 300" in problem
    assert "expected a number" in _problems(environ={"BOUNDWATCH_ENGINE__SLOW_READ_SECONDS": "often"})[0]
