"""The systemd unit and its environment file: systemd accepts the unit, the env file sets real keys."""

from __future__ import annotations

import configparser
import dataclasses
import inspect
import itertools
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exporter import config, wire
from tests.fakes.promserver import running_daemon
from tests.fakes.wait import wait_until

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "systemd" / "boundwatch.service"
ENV_FILE = ROOT / "systemd" / "boundwatch.env"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd_analyze = pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze not installed")
_ENV_LINE = re.compile(r"^#?([A-Z][A-Z0-9_]*)=(\S*)$")


def _unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    return parser


def _values(section: str, key: str) -> list[str]:
    """Return every value of a key that systemd allows to repeat (configparser keeps the last)."""
    out, current = [], None
    for line in UNIT.read_text().splitlines():
        if line.startswith("["):
            current = line.strip("[]")
        elif current == section and line.split("=", 1)[0].strip() == key:
            out.append(line.split("=", 1)[1].strip())
    return out


def _env_lines() -> list[tuple[str, str, bool]]:
    """Return (name, value, commented out) for every assignment in the example env file."""
    out = []
    for line in ENV_FILE.read_text().splitlines():
        match = _ENV_LINE.match(line)
        if match:
            out.append((match.group(1), match.group(2), line.startswith("#")))
    return out


def _unit_with_existing_binary(tmp_path: Path) -> Path:
    """Copy the unit with ExecStart pointing at an executable that exists here."""
    text = UNIT.read_text().replace("/opt/boundwatch/bin/boundwatch", sys.executable)
    path = tmp_path / UNIT.name
    path.write_text(text)
    return path


@needs_systemd_analyze
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    """Pass `systemd-analyze verify` with no warning about the unit (unknown keys, bad values)."""
    path = _unit_with_existing_binary(tmp_path)
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    complaints = [line for line in (result.stdout + result.stderr).splitlines() if path.name in line]
    assert result.returncode == 0, result.stderr
    assert complaints == []


@needs_systemd_analyze
def test_systemd_analyze_verify_would_catch_a_misspelt_key(tmp_path: Path) -> None:
    """Show that the verify test fails on a bad unit, so its silence means something."""
    path = _unit_with_existing_binary(tmp_path)
    path.write_text(path.read_text().replace("ProtectSystem=strict", "ProtectSystm=strict"))
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert "ProtectSystm" in result.stdout + result.stderr


@needs_systemd_analyze
def test_unit_exposure_stays_low(tmp_path: Path) -> None:
    """Keep `systemd-analyze security` exposure at 3.0 or below (the hardening is really applied)."""
    path = _unit_with_existing_binary(tmp_path)
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "security", "--offline=yes", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    match = re.search(r"Overall exposure level for \S+: ([\d.]+)", result.stdout + result.stderr)
    if match is None:
        pytest.skip("this systemd-analyze cannot rate units offline")
    assert float(match.group(1)) <= 3.0, result.stdout


def test_unit_is_a_hardened_notify_service_with_a_watchdog() -> None:
    """Run as a dedicated user with NVIDIA access, Type=notify, a watchdog and the hardening options."""
    service = _unit()["Service"]
    assert service["Type"] == "notify"
    assert re.fullmatch(r"\d+s", service["WatchdogSec"])
    assert int(service["WatchdogSec"][:-1]) >= 10  # many 0.5 s ticks, never a restart on one slow tick
    assert service["Restart"] == "on-failure"
    assert service["User"] not in {"root", "0"} and "DynamicUser" not in service
    assert "video" in service["SupplementaryGroups"].split()
    assert service["EnvironmentFile"] == "-/etc/default/boundwatch"
    assert service["ExecStart"].split()[:2] == ["/opt/boundwatch/bin/boundwatch", "run"]
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "RuntimeDirectory": "boundwatch",
        "RuntimeDirectoryMode": "0750",
    }.items():
        assert service[key] == value, key


def test_unit_leaves_other_processes_and_gpus_visible() -> None:
    """Keep /proc of other processes, /proc/stat and /dev/nvidia* reachable: the sources need them."""
    service = _unit()["Service"]
    assert service.get("ProtectProc", "default") in {"default", "ptraceable"}
    assert service.get("ProcSubset", "all") == "all"
    assert service.get("PrivateDevices", "no") == "no"
    assert "DevicePolicy" not in service or service["DevicePolicy"] == "auto"


def test_exec_start_subcommand_exists() -> None:
    """Start a sub-command the CLI really has."""
    result = subprocess.run(
        [sys.executable, "-m", "exporter", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    command = _unit()["Service"]["ExecStart"].split()[1]
    assert re.search(rf"^\s+{command}\s", result.stdout, flags=re.M), result.stdout


def test_agent_socket_directory_matches_the_daemon_default() -> None:
    """Create /run/<RuntimeDirectory>, the directory the daemon and agents use for agent.sock."""
    runtime_dir = _unit()["Service"]["RuntimeDirectory"]
    assert f'"/run/{runtime_dir}"' in inspect.getsource(wire.default_agent_socket)


def _setting(cfg: config.Config, name: str) -> object:
    """Return the value of the configuration key an environment variable names."""
    (key,) = config.env_updates({name: "0"})
    got: object = cfg
    for part in key.split("."):
        got = getattr(got, part)
    return got


def _typed(text: str, like: object) -> object:
    """Return an env value as the setting it is written for reads it (a test-side parse, not config's)."""
    if isinstance(like, bool):
        return {"true": True, "false": False}[text]
    if isinstance(like, tuple):
        return tuple(p.strip() for p in text.split(",") if p.strip())
    return type(like)(float(text)) if isinstance(like, int | float) else text


# other valid values for the string settings the file names (a path: any path)
_OTHER = {
    "BOUNDWATCH_WEB__ADDRESS": "127.0.0.1",
    "BOUNDWATCH_LOG_LEVEL": "debug",
    "BOUNDWATCH_LOG_FORMAT": "console",
}


def _other(name: str, default: object) -> str:
    """Return a valid value for a setting that differs from its default."""
    if isinstance(default, bool):
        return "false" if default else "true"
    if isinstance(default, int | float):
        return str(default + 1) if isinstance(default, int) else repr(round(default * 0.9, 6))
    if isinstance(default, tuple):
        return "http://127.0.0.1:9/metrics"
    return _OTHER.get(name, "/etc/boundwatch/other")


def test_env_file_sets_only_known_keys_and_each_takes_effect(monkeypatch) -> None:
    """Load every BOUNDWATCH_* line, commented or not: its value is read as written, and another moves the key."""
    from exporter import webconfig

    # the example's users file (/etc/boundwatch/users) is not on this machine: loading checks it exists
    # and reads it (tests/test_web_config_file.py); here only that the key is read matters
    monkeypatch.setattr(webconfig, "load_users_file", lambda path: {})
    lines = [(n, v) for n, v, _ in _env_lines() if n.startswith(config.ENV_PREFIX)]
    assert len(lines) >= 10
    for name, value in lines:
        assert len(config.env_updates({name: value})) == 1, f"{name} is not read as a configuration key"
    cfg = config.load(environ=dict(lines))  # raises ConfigError for an unknown key or a bad value
    defaults = config.load(environ={})
    for name, value in lines:
        got, default = _setting(cfg, name), _setting(defaults, name)
        like = got if default is None else default  # a setting off by default (None): its type as loaded
        assert got == _typed(value, like) and type(got) is type(like), f"{name}={value} gave {got!r}"
        other = _other(name, like)
        environ = {name: other}
        if name.startswith("BOUNDWATCH_WEB__TLS_"):  # a certificate and its key go together
            environ |= {
                "BOUNDWATCH_WEB__TLS_CERT_FILE": "/c",
                "BOUNDWATCH_WEB__TLS_KEY_FILE": "/k",
                name: other,
            }
        moved = _setting(config.load(environ=environ), name)
        assert moved == _typed(other, like) != default, f"{name}={other} gave {moved!r}"


def test_env_file_active_lines_load_together() -> None:
    """Load the uncommented settings as one environment, as systemd passes them."""
    environ = {n: v for n, v, commented in _env_lines() if not commented}
    cfg = config.load(environ=environ)
    assert cfg.web.port == config.DEFAULT_PORT
    assert cfg.web.address == "0.0.0.0"
    assert environ.get("ARGS") == ""


def test_env_file_covers_the_web_and_engine_sections() -> None:
    """Show the operator the settings they change first: port, engine URLs, sources."""
    names = {n for n, _, _ in _env_lines()}
    assert {"BOUNDWATCH_WEB__PORT", "BOUNDWATCH_ENGINE__URLS", "BOUNDWATCH_NVML__ENABLED"} <= names


def test_unit_only_uses_env_names_the_config_does_not_claim() -> None:
    """Pass flags through a variable outside BOUNDWATCH_*, so it is never read as a configuration key."""
    exec_vars = re.findall(r"\$\{?([A-Z_]+)", _unit()["Service"]["ExecStart"])
    assert exec_vars == ["ARGS"]
    assert all(not v.startswith(config.ENV_PREFIX) for v in exec_vars)
    assert dataclasses.is_dataclass(config.Config)


@pytest.mark.timeout(120)
def test_daemon_notifies_ready_and_pets_the_watchdog_well_within_watchdog_sec(tmp_path: Path) -> None:
    """Send READY=1 and then WATCHDOG=1 at least every WatchdogSec/4 over NOTIFY_SOCKET, as Type=notify needs."""
    watchdog_sec = int(_unit()["Service"]["WatchdogSec"].rstrip("s"))
    notify_path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(notify_path))
        sock.settimeout(watchdog_sec / 4)
        env = {"NOTIFY_SOCKET": str(notify_path), "WATCHDOG_USEC": str(watchdog_sec * 1_000_000)}
        with running_daemon(tmp_path / "daemon", engine_pages=(), extra_env=env):
            messages: list[tuple[float, str]] = []

            def five_pets() -> bool:  # each poll takes the next message, or raises after WatchdogSec/4
                messages.append((time.monotonic(), sock.recv(4096).decode()))
                return sum(m == "WATCHDOG=1" for _, m in messages) >= 5

            wait_until(five_pets, 30, 0, lambda: f"five WATCHDOG=1 (got {[m for _, m in messages]})")
    kinds = [m for _, m in messages]
    assert "READY=1" in kinds
    pets = [t for t, m in messages if m == "WATCHDOG=1"]
    assert len(pets) >= 5, kinds
    assert max(b - a for a, b in itertools.pairwise(pets)) < watchdog_sec / 4
