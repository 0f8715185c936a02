"""Packaging: the wheel carries the dashboards, rules and unit, `boundwatch assets` writes them out, a LICENSE,
and `make run` installs only what running needs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from exporter.cli import main

ROOT = Path(__file__).resolve().parent.parent
ASSETS = sorted(
    [*(ROOT / "dashboards").glob("*.json"), *(ROOT / "alerts").glob("*.yml"), *(ROOT / "systemd").iterdir()]
)


def _checkout_copy(dest: Path) -> Path:
    """Copy the files git would put in a clean clone (tracked and new, not ignored) to dest."""
    files = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def _isolation() -> list[str]:
    """Build with this interpreter's setuptools and wheel when it has them, else in pip's isolated env."""
    try:
        import setuptools
        import wheel  # noqa: F401
    except ImportError:
        return []
    return ["--no-build-isolation"] if int(setuptools.__version__.split(".")[0]) >= 68 else []


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the wheel from a copy of the checkout, as `pip wheel .` on a clean clone would."""
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    work = tmp_path_factory.mktemp("wheel")
    src = _checkout_copy(work / "src")
    out = work / "dist"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            *_isolation(),
            "-q",
            "-w",
            str(out),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (built,) = out.glob("boundwatch-*.whl")
    return built


def test_license_is_the_apache_2_text_pyproject_names() -> None:
    """Ship the Apache License 2.0 text, the license pyproject.toml declares."""
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["license"] == {"text": "Apache-2.0"}


def test_wheel_carries_the_assets_license_and_no_test_toolchain(wheel: Path) -> None:
    """Put every dashboard, rule file and systemd file under exporter/assets/, the LICENSE in dist-info."""
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        metadata = next(zf.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
        for asset in ASSETS:
            packed = f"exporter/assets/{asset.parent.name}/{asset.name}"
            assert packed in names, packed
            assert zf.read(packed) == asset.read_bytes(), packed
    assert "exporter/py.typed" in names and "exporter/commands/assets.py" in names
    assert any(n.endswith(("dist-info/LICENSE", "dist-info/licenses/LICENSE")) for n in names), sorted(
        n for n in names if "dist-info" in n
    )
    required = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    plain = [line for line in required if "extra ==" not in line]
    assert any("aiohttp" in line for line in plain)
    assert not [line for line in plain if any(t in line for t in ("pytest", "ruff", "mypy", "psutil"))], plain


def test_installed_wheel_writes_its_assets(wheel: Path, tmp_path: Path) -> None:
    """Install the wheel into a fresh directory and run `boundwatch assets DIR` from there, away from the checkout."""
    site = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert install.returncode == 0, install.stderr
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = tmp_path / "out"
    code = "import exporter, sys; from exporter.cli import main; print(exporter.__file__, file=sys.stderr); sys.exit(main(sys.argv[1:]))"
    result = subprocess.run(
        [sys.executable, "-c", code, "assets", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().startswith(str(site))  # the installed copy ran, not the checkout
    for asset in ASSETS:
        assert (out / asset.parent.name / asset.name).read_bytes() == asset.read_bytes()


def test_assets_refuses_to_overwrite_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Write the assets from the checkout, refuse a second time (exit 1), overwrite with --force."""
    assert main(["assets", str(tmp_path)]) == 0
    (tmp_path / "alerts" / "boundwatch.rules.yml").write_text("edited")
    assert main(["assets", str(tmp_path)]) == 1
    assert "--force" in capsys.readouterr().err
    assert (tmp_path / "alerts" / "boundwatch.rules.yml").read_text() == "edited"
    assert main(["assets", "--force", str(tmp_path)]) == 0
    assert (tmp_path / "alerts" / "boundwatch.rules.yml").read_bytes() == (
        ROOT / "alerts" / "boundwatch.rules.yml"
    ).read_bytes()


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_make_run_installs_only_what_running_needs(tmp_path: Path) -> None:
    """Install the package without extras for `make run` and `make demo`; the test toolchain only for `make test`."""

    def dry(target: str) -> str:
        result = subprocess.run(
            ["make", "-n", "-f", str(ROOT / "Makefile"), f"VENV={tmp_path / 'venv'}", target],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    for target in ("run", "demo"):
        text = dry(target)
        assert "pip install --quiet -e ." in text and "[test]" not in text, text
    assert "-e '.[test]'" in dry("test")
    assert "boundwatch demo" in dry("demo") and "make demo" in dry("run")
