"""Type-check every dashboard against Grafana's published schema (@grafana/schema from npm) with tsc.

Each dashboard (less its annotations, whose fields are datasource-specific) is a literal of type
`Dashboard` and each panel's options a literal of its panel plugin's `Options` (timeseries, stat,
state-timeline, heatmap, table), so an unknown property (heatmap `tooltip.show` instead of
`tooltip.mode`), a wrong type or an enum value Grafana does not know fails. Properties Grafana fills
with defaults may be left out. Needs node and `make grafana-schema` (npm installs @grafana/schema and
typescript into .cache/grafana-schema); skipped without them. BOUNDWATCH_GRAFANA_SCHEMA points elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.fakes.promql import ROOT

MODULES = (
    Path(os.environ.get("BOUNDWATCH_GRAFANA_SCHEMA", ROOT / ".cache" / "grafana-schema")) / "node_modules"
)
SCHEMA = MODULES / "@grafana" / "schema" / "dist" / "esm"
TSC = MODULES / ".bin" / "tsc"
PANEL_OPTIONS = {
    "timeseries": "timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen",
    "stat": "stat/panelcfg/x/StatPanelCfg_types.gen",
    "state-timeline": "statetimeline/panelcfg/x/StateTimelinePanelCfg_types.gen",
    "heatmap": "heatmap/panelcfg/x/HeatmapPanelCfg_types.gen",
    "table": "table/panelcfg/x/TablePanelCfg_types.gen",
}
# Every property optional (Grafana fills defaults); string enums as the union of their values.
LOOSE = (
    "type Loose<T> = T extends string ? `${T}` : T extends Array<infer U> ? Array<Loose<U>>"
    " : T extends object ? { [K in keyof T]?: Loose<T[K]> } : T;"
)

pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or not TSC.exists() or not SCHEMA.is_dir(),
    reason="node, typescript or @grafana/schema missing (make grafana-schema)",
)


def typescript_for(dashboards: dict[str, dict]) -> str:
    """Return a TypeScript module typing each dashboard and each panel's options as literals."""
    lines = [f"import type {{ Dashboard }} from '{SCHEMA}/raw/dashboard/x/dashboard_types.gen';"]
    names = {}
    for i, (kind, module) in enumerate(PANEL_OPTIONS.items()):
        names[kind] = f"Options{i}"
        lines.append(f"import type {{ Options as Options{i} }} from '{SCHEMA}/raw/composable/{module}';")
    lines.append(LOOSE)
    for name, dashboard in dashboards.items():
        var = name.replace("-", "_")
        body = {k: v for k, v in dashboard.items() if k != "annotations"}
        lines.append(f"export const {var}: Loose<Omit<Dashboard, 'annotations'>> = {json.dumps(body)};")
        for panel in dashboard["panels"]:
            kind = names.get(panel["type"])
            if kind is not None:
                lines.append(
                    f"export const {var}_{panel['id']}: Loose<{kind}> = {json.dumps(panel.get('options', {}))};"
                )
    return "\n".join(lines) + "\n"


def _tsc(source: str, workdir: Path) -> subprocess.CompletedProcess[str]:
    path = workdir / "dashboards.ts"
    path.write_text(source)
    args = [
        str(TSC),
        "--noEmit",
        "--strict",
        "--skipLibCheck",
        "--target",
        "es2020",
        "--moduleResolution",
        "node",
        str(path),
    ]
    return subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)


def test_dashboards_type_check_against_grafana_schema(tmp_path: Path) -> None:
    """Pass tsc --strict with every dashboard and panel-options literal typed by @grafana/schema."""
    dashboards = {p.stem: json.loads(p.read_text()) for p in sorted((ROOT / "dashboards").glob("*.json"))}
    assert sum(p["type"] in PANEL_OPTIONS for d in dashboards.values() for p in d["panels"]) > 30
    result = _tsc(typescript_for(dashboards), tmp_path)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_the_check_rejects_grafana_10_heatmap_tooltip(tmp_path: Path) -> None:
    """Fail on the old heatmap `tooltip.show`: the check sees what Grafana 11 would ignore."""
    heatmap = {
        "panels": [{"id": 1, "type": "heatmap", "options": {"tooltip": {"show": True, "yHistogram": False}}}]
    }
    result = _tsc(typescript_for({"old": heatmap}), tmp_path)
    assert result.returncode != 0 and '"show"' in result.stdout, result.stdout
