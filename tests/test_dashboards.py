"""Grafana dashboards: catalogue names only, the datasource/instance/gpu variables, $__rate_interval, and
every query executed by a real Prometheus that scraped the real daemon."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.catalogue import BY_NAME
from tests.fakes.promql import (
    ROOT,
    exposed_names,
    gen_alerts,
    known_names,
    label_values_query,
    labels_of,
    metric_names,
    recording_rule_names,
    selectors,
)
from tests.fakes.promserver import (
    PROMETHEUS,
    running_daemon,
    running_demo,
    running_prometheus,
    serving_full_page,
)
from tests.fakes.wait import wait_until

DASHBOARD_FILES = sorted((ROOT / "dashboards").glob("*.json"))
OVERVIEW = ROOT / "dashboards" / "boundwatch-overview.json"
DOCS = ROOT / "docs" / "dashboards.md"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _load(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # collapsed rows keep their panels inside


def _targets(dashboard: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for panel in _panels(dashboard):
        for target in panel.get("targets", []):
            yield panel["title"], target


def _variables(dashboard: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dashboard["templating"]["list"]}


def _variable_query(variable: dict[str, Any]) -> str:
    query = variable["query"]
    return str(query["query"] if isinstance(query, dict) else query)


def _all_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """Return (where, PromQL) for every panel target, variable query and annotation query."""
    out = [(f"panel {title!r} {t['refId']}", t["expr"]) for title, t in _targets(dashboard)]
    for name, variable in _variables(dashboard).items():
        if variable["type"] == "query":
            split = label_values_query(_variable_query(variable))
            assert split is not None, f"variable {name}: not a label_values(expr, label) query"
            out.append((f"variable {name}", split[0]))
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if "expr" in annotation:
            out.append((f"annotation {annotation['name']!r}", annotation["expr"]))
    return out


def _concrete(expr: str) -> str:
    """Substitute Grafana's variables the way a dashboard with every GPU of every instance selected would."""
    return (
        expr.replace("$__rate_interval", "1m")
        .replace("$__range", "5m")
        .replace("${job}", ".*")
        .replace("$job", ".*")
        .replace("${instance}", ".*")
        .replace("$instance", ".*")
        .replace("${gpu}", ".*")
        .replace("$gpu", ".*")
    )


@pytest.fixture(params=DASHBOARD_FILES, ids=[p.name for p in DASHBOARD_FILES])
def dashboard(request: pytest.FixtureRequest) -> dict[str, Any]:
    return _load(request.param)


def test_overview_dashboard_exists() -> None:
    """Ship dashboards/boundwatch-overview.json."""
    assert OVERVIEW in DASHBOARD_FILES


def test_dashboard_has_fixed_uid_title_and_schema(dashboard: dict[str, Any]) -> None:
    """Keep a fixed uid (links survive re-imports), a title, tags and a current schemaVersion."""
    assert re.fullmatch(r"boundwatch-[a-z0-9-]+", dashboard["uid"])
    assert dashboard["title"].startswith("boundwatch")
    assert "boundwatch" in dashboard["tags"]
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard.get("id") is None  # an exported id would clash on import


def test_datasource_job_instance_and_gpu_variables(dashboard: dict[str, Any]) -> None:
    """Declare `datasource` (Prometheus), `job`, `instance` (of those jobs) and `gpu` variables, multi-select with All."""
    variables = _variables(dashboard)
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert _variable_query(variables["job"]) == "label_values(boundwatch_build_info, job)"
    assert (
        _variable_query(variables["instance"]) == 'label_values(boundwatch_build_info{job=~"$job"}, instance)'
    )
    assert (
        _variable_query(variables["gpu"])
        == 'label_values(boundwatch_gpu_info{job=~"$job", instance=~"$instance"}, gpu)'
    )
    for name in ("job", "instance", "gpu"):
        assert variables[name]["multi"] is True and variables[name]["includeAll"] is True, name
        assert variables[name]["datasource"] == DATASOURCE, name


def test_every_panel_and_target_uses_the_datasource_variable(dashboard: dict[str, Any]) -> None:
    """Query through `${datasource}` everywhere: panels, targets, annotations."""
    for panel in _panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel.get("datasource") == DATASOURCE, panel["title"]
        assert panel.get("targets"), f"{panel['title']}: no query"
        for target in panel["targets"]:
            assert target.get("datasource") == DATASOURCE, (panel["title"], target["refId"])
    for annotation in dashboard["annotations"]["list"]:
        if not annotation.get("builtIn"):
            assert annotation["datasource"] == DATASOURCE, annotation["name"]


def test_every_query_names_only_catalogue_metrics(dashboard: dict[str, Any]) -> None:
    """Select only names in exporter/catalogue.py (histogram suffixes map to their family) or recording rules."""
    known = known_names()
    for where, expr in _all_queries(dashboard):
        names = metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        assert not names - known, f"{where}: not in the catalogue: {sorted(names - known)}"


def test_every_matcher_uses_labels_the_metric_has(dashboard: dict[str, Any]) -> None:
    """Match only on labels the series carry (catalogue labels plus instance, job, le)."""
    recorded = recording_rule_names()
    for where, expr in _all_queries(dashboard):
        for name, labels in selectors(expr):
            if name in recorded:
                continue
            assert labels <= labels_of(name), (
                f"{where}: {name} has no label(s) {sorted(labels - labels_of(name))}"
            )


def test_every_range_uses_rate_interval(dashboard: dict[str, Any]) -> None:
    """Use `[$__rate_interval]` (or the dashboard's `[$__range]`) for every range, never a fixed window."""
    for where, expr in _all_queries(dashboard):
        for window in re.findall(r"\[([^\]]*)\]", expr):
            assert window in ("$__rate_interval", "$__range"), f"{where}: range [{window}]"
        if re.search(r"\b(rate|irate|increase)\(", expr):
            assert "[$__rate_interval]" in expr or "[$__range]" in expr, where


def test_every_selector_filters_instance_and_gpu(dashboard: dict[str, Any]) -> None:
    """Filter every series by `job=~"$job"` and `instance=~"$instance"`, and by `gpu=~"$gpu"` where it has a gpu label."""
    families = exposed_names()
    for where, expr in _all_queries(dashboard):
        if where in ("variable job", "variable instance"):
            continue  # the job and instance lists themselves
        found = dict.fromkeys(metric_names(expr), False)
        for name, _ in selectors(expr):
            found[name] = True
        assert all(found.values()), f"{where}: a metric without a label filter: {found}"
        for match in re.finditer(r"([A-Za-z_:][\w:]*)\s*\{([^{}]*)\}", expr):
            name, matchers = match.group(1), match.group(2)
            assert 'instance=~"$instance"' in matchers, f"{where}: {name} not filtered by $instance"
            assert 'job=~"$job"' in matchers, f"{where}: {name} not filtered by $job"
            if name in families and "gpu" in BY_NAME[families[name]].labels and where != "variable gpu":
                assert 'gpu=~"$gpu"' in matchers, f"{where}: {name} not filtered by $gpu"


def test_no_hard_coded_instance_or_host(dashboard: dict[str, Any]) -> None:
    """Never pin an instance, host, port or job in a query."""
    for where, expr in _all_queries(dashboard):
        for value in re.findall(r'instance\s*(?:=~|!~|!=|=)\s*"([^"]*)"', expr):
            assert value == "$instance", f"{where}: instance {value!r}"
        assert not re.search(r"\d+\.\d+\.\d+\.\d+|:\d{4,5}\b|localhost", expr), where
        for value in re.findall(r'job\s*(?:=~|!~|!=|=)\s*"([^"]*)"', expr):
            assert value == "$job", f"{where}: job {value!r}"


def test_panel_ids_unique_and_grid_does_not_overlap(dashboard: dict[str, Any]) -> None:
    """Give each panel its own id and its own place on the 24-column grid."""
    ids = [p["id"] for p in _panels(dashboard)]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for panel in _panels(dashboard):
        pos = panel["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells.get((x, y))}"
                cells[(x, y)] = panel["title"]


def test_ref_ids_unique_within_each_panel(dashboard: dict[str, Any]) -> None:
    """Give each query of a panel its own refId."""
    for panel in _panels(dashboard):
        refs = [t["refId"] for t in panel.get("targets", [])]
        assert len(refs) == len(set(refs)), panel["title"]


def test_overview_shows_what_the_operator_needs() -> None:
    """Chart the verdict, its reasons, busy by source, host-bound share, idle gaps, graph share, engine,
    API-server CPU, cgroup quota and throttling, power, clocks, clock events and source health."""
    dashboard = _load(OVERVIEW)
    used = {name for _, expr in _all_queries(dashboard) for name in metric_names(expr)}
    assert {
        "boundwatch_bound",
        "boundwatch_bound_reason",
        "boundwatch_gpu_busy_seconds_total",
        "boundwatch_gpu_observed_seconds_total",
        "boundwatch_gpu_busy_ratio",
        "boundwatch_host_bound_seconds_total",
        "boundwatch_gpu_idle_gap_seconds_bucket",
        "boundwatch_gpu_graph_busy_seconds_total",
        "boundwatch_engine_requests_running",
        "boundwatch_engine_requests_waiting",
        "boundwatch_engine_running_request_seconds_total",
        "boundwatch_engine_generation_tokens_total",
        "boundwatch_engine_steps_total",
        "boundwatch_api_server_cpu_ratio",
        "boundwatch_cgroup_cpu_quota_cores",
        "boundwatch_cgroup_cpu_throttled_seconds_total",
        "boundwatch_gpu_power_watts",
        "boundwatch_gpu_power_limit_watts",
        "boundwatch_gpu_sm_clock_hertz",
        "boundwatch_gpu_sm_clock_max_hertz",
        "boundwatch_gpu_clock_event_reason",
        "boundwatch_source_up",
    } <= used
    types = {p["title"]: p["type"] for p in _panels(dashboard)}
    assert types["Verdict per GPU"] == "state-timeline"
    heatmap = next(p for p in _panels(dashboard) if p["type"] == "heatmap")
    assert heatmap["targets"][0]["format"] == "heatmap"
    assert "boundwatch_gpu_idle_gap_seconds_bucket" in heatmap["targets"][0]["expr"]


def test_docs_describe_every_panel() -> None:
    """Name every panel of every dashboard in docs/dashboards.md."""
    text = DOCS.read_text()
    for path in DASHBOARD_FILES:
        assert path.name in text, path.name
        for panel in _panels(_load(path)):
            if panel["type"] != "row":
                assert panel["title"] in text, f"{path.name}: panel {panel['title']!r} is not in {DOCS.name}"


# --- a real Prometheus scraping the real daemon --------------------------------------------------


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Run the daemon, a full catalogue page, the demo and a Prometheus scraping all three every second, rules loaded."""
    if PROMETHEUS is None:
        pytest.skip("prometheus is not installed")
    workdir = tmp_path_factory.mktemp("prometheus")
    jobs: dict[str, list[str]] = {}
    with (
        running_daemon(workdir / "daemon") as daemon,
        serving_full_page() as full_page,
        running_demo(workdir / "demo", "--phase-seconds", "6") as (demo, _),
    ):
        jobs = {"boundwatch": [daemon.target], "boundwatch-full-page": [full_page], "boundwatch-demo": [demo]}
        # The shipped rules with a selector that takes every job in and 10 s windows (tools/gen_alerts.py).
        rules = workdir / "boundwatch.rules.yml"
        rules.write_text(gen_alerts().render({"selector": 'job=~"boundwatch.*"', "rate_window": "10s"}))
        with running_prometheus(workdir / "prom", jobs, [rules]) as prom:
            prom.daemon = daemon
            prom.full_page = full_page
            prom.demo = demo
            prom.wait_for('up{job="boundwatch"} == 1')
            prom.wait_for('up{job="boundwatch-full-page"} == 1')
            # Two scrapes of each: rates over the dashboards' 1m have values.
            prom.wait_for('rate(boundwatch_ticks_total{job="boundwatch"}[1m]) > 0')
            prom.wait_for('rate(boundwatch_host_bound_seconds_total{job="boundwatch-full-page"}[1m]) > 0')
            # The demo's GPUs cycle 6 s phases; wait until one has been host-bound through a window.
            prom.wait_for('instance_gpu:boundwatch_host_bound:ratio_rate5m{job="boundwatch-demo"} > 0', 60)
            prom.wait_for('instance_gpu:boundwatch_gpu_graph_busy:ratio_rate5m{job="boundwatch-demo"}', 30)
            yield prom


@pytest.mark.prometheus
@pytest.mark.timeout(240)
def test_every_dashboard_query_runs_on_real_prometheus(prometheus: Any) -> None:
    """Execute every panel, variable and annotation query; each must come back `success`, and every panel
    and variable query must return data from the full page (so no matcher or join selects nothing)."""
    failures = []
    count = 0
    for path in DASHBOARD_FILES:
        for where, expr in _all_queries(_load(path)):
            answer = prometheus.query(_concrete(expr))
            count += 1
            if answer.get("status") != "success":
                failures.append(f"{path.name} {where}: {answer.get('error')}\n  {_concrete(expr)}")
            elif not answer["data"]["result"] and not where.startswith("annotation"):
                failures.append(f"{path.name} {where}: no data\n  {_concrete(expr)}")
    assert count >= 40
    assert not failures, "\n".join(failures)


# Needs a GPU to run at all: the demo has no self-test probe to show.
NOT_IN_DEMO = ("boundwatch_probe_",)


@pytest.mark.prometheus
@pytest.mark.timeout(240)
def test_every_dashboard_query_returns_data_from_the_demo(prometheus: Any) -> None:
    """Fill every panel and variable of every dashboard from `boundwatch demo` alone (instance = the demo)."""
    failures = []
    for path in DASHBOARD_FILES:
        for where, expr in _all_queries(_load(path)):
            if where.startswith("annotation") or any(p in expr for p in NOT_IN_DEMO):
                continue
            if "ALERTS" in expr:
                continue  # alerts need minutes of host-bound time (tests/test_alerts_e2e.py)
            query = _concrete(expr.replace("$instance", prometheus.demo.replace(".", "\\\\.")))
            answer = prometheus.query(query)
            if answer.get("status") != "success" or not answer["data"]["result"]:
                failures.append(f"{path.name} {where}: {answer.get('error') or 'no data'}\n  {query}")
    assert not failures, "\n".join(failures)


# What a data link reads from the series or table row it is clicked on.
LINK_LABEL = re.compile(r"\$\{__(?:field\.labels|data\.fields)\.([a-zA-Z_][a-zA-Z0-9_]*)\}")


def _link_label(value: str) -> str | None:
    """Return the label a link value reads from the clicked series or row, or None for anything else."""
    found = LINK_LABEL.fullmatch(value)
    return found.group(1) if found else None


def _data_links(dashboard: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for panel in _panels(dashboard):
        for link in panel.get("fieldConfig", {}).get("defaults", {}).get("links", []):
            yield panel, link


@pytest.mark.prometheus
@pytest.mark.timeout(240)
def test_every_data_link_finds_its_labels_in_the_panel_data(prometheus: Any) -> None:
    """Give every series (or table row) of a panel with data links the labels its links carry, from the demo."""
    failures = []
    checked = 0
    for path in DASHBOARD_FILES:
        dashboard = _load(path)
        wanted: dict[int, tuple[dict[str, Any], set[str]]] = {}
        for panel, link in _data_links(dashboard):
            labels = set(LINK_LABEL.findall(link["url"])) | set(LINK_LABEL.findall(link["title"]))
            wanted.setdefault(panel["id"], (panel, set()))[1].update(labels)
        for panel, labels in wanted.values():
            for target in panel["targets"]:
                query = _concrete(target["expr"].replace("$instance", prometheus.demo.replace(".", "\\\\.")))
                answer = prometheus.query(query)
                series = answer.get("data", {}).get("result", [])
                checked += 1
                if not series:
                    failures.append(f"{path.name} {panel['title']!r} {target['refId']}: no data")
                for s in series:
                    missing = labels - set(s["metric"])
                    if missing:
                        failures.append(
                            f"{path.name} {panel['title']!r} {target['refId']}: no {missing} in {s['metric']}"
                        )
                        break
    assert checked >= 8
    assert not failures, "\n".join(failures)


def test_panels_show_counts_and_units_right() -> None:
    """Render counts as counts (CPUs, probe pass/fail), bandwidth in B/s and age in s; heatmap tooltip.mode."""
    panels = {p["title"]: p for p in _panels(_load(OVERVIEW))}

    def units(panel: dict[str, Any]) -> dict[str, str]:
        out = {}
        for o in panel["fieldConfig"]["overrides"]:
            for prop in o["properties"]:
                if prop["id"] == "unit":
                    out[o["matcher"]["options"]] = prop["value"]
        return out

    cpus = panels["Host CPUs busy"]
    ref = next(t["refId"] for t in cpus["targets"] if "boundwatch_host_cpus{" in t["expr"])
    assert cpus["fieldConfig"]["defaults"]["unit"] == "percentunit" and units(cpus)[ref] == "none"
    probe = panels["Probe"]
    by_metric = {t["expr"].split("{")[0].split()[-1]: t["refId"] for t in probe["targets"]}
    assert units(probe)[by_metric["boundwatch_probe_hbm_bandwidth_bytes_per_second"]] == "Bps"
    assert units(probe)[by_metric["boundwatch_probe_last_run_timestamp_seconds"]] == "s"
    heatmap = next(p for p in panels.values() if p["type"] == "heatmap")
    assert (
        heatmap["options"]["tooltip"]["mode"] in ("single", "multi")
        and "show" not in heatmap["options"]["tooltip"]
    )


def test_data_links_open_vllm_and_dcgm_dashboards_for_the_same_instance() -> None:
    """Link GPU panels to dcgm-exporter's dashboard and engine panels to vLLM's, by UID, carrying the instance."""
    uids = {"vllm_dashboard": "vllm-overview", "dcgm_dashboard": "Oxed_c6Wz"}  # the published dashboards
    for path in DASHBOARD_FILES:
        dashboard = _load(path)
        variables = _variables(dashboard)
        for name, uid in uids.items():
            assert variables[name]["type"] == "constant" and variables[name]["query"] == uid, (
                path.name,
                name,
            )
            assert variables[name]["hide"] == 2  # set once in the dashboard's settings, not a drop-down
        links: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {name: [] for name in uids}
        for panel, link in _data_links(dashboard):
            for name in uids:
                if link["url"].startswith(f"/d/${{{name}}}/?"):
                    links[name].append((panel, link))
        for name, found in links.items():
            assert found, f"{path.name}: no data link to {name}"
            for panel, link in found:
                url = link["url"]
                carried = dict(part.split("=", 1) for part in url.split("?", 1)[1].split("&") if "=" in part)
                assert _link_label(carried["var-instance"]) == "instance", (panel["title"], url)
                assert "${datasource:queryparam}" in url and url.endswith("&${__url_time_range}")
                if "var-gpu" in carried:  # dcgm-exporter's gpu label is the same NVML index as boundwatch's
                    assert name == "dcgm_dashboard", (panel["title"], url)
                    assert _link_label(carried["var-gpu"]) == "gpu", (panel["title"], url)
        gpu_panels = {p["title"] for p, link in links["dcgm_dashboard"] if "var-gpu=" in link["url"]}
        assert gpu_panels, f"{path.name}: no per-GPU link to dcgm-exporter"


def test_fleet_and_drill_down_link_to_each_other_and_use_the_recording_rules() -> None:
    """Link fleet -> drill-down (dashboard link and row data links) and back; build the fleet on recording rules."""
    fleet = _load(ROOT / "dashboards" / "boundwatch-fleet.json")
    drill = _load(OVERVIEW)
    assert any(f"/d/{drill['uid']}/" in link.get("url", "") for link in fleet["links"])
    assert any(f"/d/{fleet['uid']}/" in link.get("url", "") for link in drill["links"])
    tables = [p for p in _panels(fleet) if p["type"] == "table"]
    for table in tables:  # every row opens the drill-down (other links go to vLLM's and dcgm's dashboards)
        urls = [link["url"] for link in table["fieldConfig"]["defaults"]["links"]]
        assert any(f"/d/{drill['uid']}/" in u and "var-instance=" in u for u in urls), table["title"]
    for dashboard in (fleet, drill):
        assert {tuple(link.get("tags", [])) for link in dashboard["links"]} >= {("vllm",), ("dcgm",)}
    rules = recording_rule_names()
    fleet_names = {n for _, e in _all_queries(fleet) for n in metric_names(e)}
    drill_names = {n for _, e in _all_queries(drill) for n in metric_names(e)}
    assert {
        "instance_verdict:boundwatch_gpus:count",
        "instance:boundwatch_host_bound_gpus:rate5m",
    } <= fleet_names
    assert "instance_gpu:boundwatch_host_bound:ratio_rate5m" in fleet_names & rules
    assert drill_names & rules
    assert any("topk(" in e for _, e in _all_queries(fleet))


@pytest.mark.prometheus
@pytest.mark.timeout(240)
def test_core_series_reach_prometheus(prometheus: Any) -> None:
    """See the daemon's build info, sources, ticks and the engine page's series in Prometheus."""
    target = prometheus.daemon.target
    info = prometheus.wait_for('boundwatch_build_info{job="boundwatch"}')
    assert info[0]["metric"]["instance"] == target
    assert info[0]["metric"]["job"] == "boundwatch"
    sources = {r["metric"]["source"] for r in prometheus.wait_for('boundwatch_source_up{job="boundwatch"}')}
    assert {"nvml", "host", "engine"} <= sources
    assert prometheus.wait_for('boundwatch_source_up{job="boundwatch", source="engine"} == 1')
    assert prometheus.wait_for('boundwatch_engine_info{job="boundwatch"}')
    ticks = prometheus.wait_for('irate(boundwatch_ticks_total{job="boundwatch"}[10s])')
    assert 0.5 <= float(ticks[0]["value"][1]) <= 4.0  # 0.5 s ticks: about 2 a second


@pytest.mark.prometheus
@pytest.mark.timeout(240)
def test_instance_variable_lists_the_daemon(prometheus: Any) -> None:
    """Resolve the instance variable's label_values() query to the scraped daemon."""
    variable = _variables(_load(OVERVIEW))["instance"]
    expr, label = label_values_query(_variable_query(variable)) or ("", "")
    answer = prometheus.api("series", **{"match[]": _concrete(expr)})
    assert answer["status"] == "success"
    assert {s[label] for s in answer["data"]} == {
        prometheus.daemon.target,
        prometheus.full_page,
        prometheus.demo,
    }


@pytest.mark.prometheus
@pytest.mark.timeout(240)
def test_every_scraped_boundwatch_name_is_in_the_catalogue(prometheus: Any) -> None:
    """Find every boundwatch_* name Prometheus scraped in the catalogue (the dashboards can chart it)."""
    answer = prometheus.api("label/__name__/values", **{"match[]": '{job="boundwatch"}'})
    assert answer["status"] == "success"
    scraped = {n for n in answer["data"] if n.startswith("boundwatch_")}
    assert "boundwatch_build_info" in scraped
    assert not scraped - set(exposed_names()), sorted(scraped - set(exposed_names()))


@pytest.mark.prometheus
@pytest.mark.timeout(240)
def test_rules_evaluate_without_errors_on_real_prometheus(prometheus: Any) -> None:
    """Load alerts/ into Prometheus and see every rule evaluate with health `ok`."""

    def evaluated() -> list[dict[str, Any]]:
        """Return the rules once every one has been evaluated, else []."""
        rules = [r for g in prometheus.api("rules")["data"]["groups"] for r in g["rules"]]
        return rules if rules and all(r.get("lastEvaluation", "").startswith("20") for r in rules) else []

    rules = wait_until(evaluated, 30, 0.5, "every rule evaluated once")
    assert len(rules) >= 15
    bad = [(r["name"], r.get("health"), r.get("lastError")) for r in rules if r.get("health") != "ok"]
    assert not bad, bad


@pytest.mark.prometheus
@pytest.mark.timeout(240)
def test_recording_rules_prefer_cupti_on_real_prometheus(prometheus: Any) -> None:
    """Record one best busy series per GPU, from CUPTI when every source reports (the full page)."""
    series = prometheus.wait_for('instance_gpu:boundwatch_gpu_busy:ratio_rate5m{job="boundwatch-full-page"}')
    assert sorted(s["metric"]["gpu"] for s in series) == ["0", "1"]
    assert {s["metric"]["source"] for s in series} == {"cupti"}
