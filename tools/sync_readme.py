"""Rewrite the README's metric table from the catalogue: python tools/sync_readme.py."""

from pathlib import Path

from exporter.commands.catalogue import markdown

readme = Path(__file__).resolve().parent.parent / "README.md"
text = readme.read_text()
head, rest = text.split("<!-- catalogue:start -->\n", 1)
_, tail = rest.split("<!-- catalogue:end -->", 1)
readme.write_text(f"{head}<!-- catalogue:start -->\n{markdown()}<!-- catalogue:end -->{tail}")
