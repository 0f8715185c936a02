"""Copy the operator's assets (dashboards, alert rules, the systemd unit) into the wheel.

They live at the top of the repository, where Prometheus, Grafana and systemd users find them;
the build puts copies under `exporter/assets/` so `boundwatch assets DIR` can write them out
wherever the package was installed. Everything else is in pyproject.toml.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
ASSETS = {"dashboards": "*.json", "alerts": "*.yml", "systemd": "*"}


class BuildWithAssets(build_py):
    """build_py, then copy each asset directory into exporter/assets/ of the build."""

    def run(self) -> None:
        super().run()
        for folder, pattern in ASSETS.items():
            for source in sorted((ROOT / folder).glob(pattern)):
                if source.is_file():
                    target = Path(self.build_lib, "exporter", "assets", folder, source.name)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source, target)


setup(cmdclass={"build_py": BuildWithAssets})
