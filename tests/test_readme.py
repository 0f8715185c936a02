"""The README opens with the two set-up commands and its metric table matches the catalogue."""

import re
from pathlib import Path

from exporter.catalogue import METRICS
from exporter.commands.catalogue import markdown

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_opens_with_make_run_and_make_test():
    lines = [line for line in README.read_text().splitlines() if line.strip() and not line.startswith("```")]
    assert lines[0].startswith("make run")
    assert lines[1].startswith("make test")


def test_readme_metric_table_is_the_catalogue():
    text = README.read_text()
    block = text.split("<!-- catalogue:start -->\n", 1)[1].split("<!-- catalogue:end -->", 1)[0]
    assert block.strip() == markdown().strip(), "run: python -m exporter catalogue > the README block"
    listed = set(re.findall(r"^\| `(boundwatch_[a-z_]+)`", block, flags=re.M))
    assert listed == {m.name for m in METRICS}
