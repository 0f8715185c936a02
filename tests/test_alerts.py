"""Alert and recording rules: promtool checks and unit tests, catalogue names and labels, annotations, runbook."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from exporter.snapshot.gpu import CLOCK_EVENT_REASONS
from exporter.snapshot.verdict import REASONS
from tests.fakes.promql import (
    ALL_LABELS,
    ROOT,
    RULE_FILES,
    grouping_labels,
    known_names,
    labels_of,
    load_rule_groups,
    metric_names,
    recording_rule_names,
    selectors,
    template_queries,
)

PROMTOOL = shutil.which("promtool")
GEN = ROOT / "tools" / "gen_alerts.py"
UNIT_TEST_FILES = sorted((ROOT / "tests" / "alerts").glob("*.yml"))
RUNBOOK = ROOT / "docs" / "alerts.md"
RUNBOOK_URL = "https://github.com/boundwatch/boundwatch/blob/main/docs/alerts.md#"
SEVERITIES = {"critical", "warning", "info"}

needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed")


def _rules() -> list[dict]:
    return [rule for group in load_rule_groups() for rule in group["rules"]]


def _alerts() -> list[dict]:
    return [rule for rule in _rules() if "alert" in rule]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def _github_anchor(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_rule_files_exist() -> None:
    """Ship at least one rule file, holding the alerts the field report needs."""
    assert RULE_FILES
    names = {rule["alert"] for rule in _alerts()}
    assert {
        "BoundwatchGPUStarvedWhileWorkPending",
        "BoundwatchHostBoundAPIServerSaturated",
        "BoundwatchCPUQuotaThrottling",
        "BoundwatchCUDAGraphFallback",
        "BoundwatchGPUClockThrottled",
        "BoundwatchSourceDown",
        "BoundwatchAgentMissing",
        "BoundwatchDown",
    } <= names


@pytest.mark.prometheus
@needs_promtool
def test_promtool_check_rules_accepts_every_rule_file() -> None:
    """Pass `promtool check rules` on every file in alerts/."""
    result = _run(PROMTOOL, "check", "rules", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.prometheus
@needs_promtool
def test_promtool_rule_unit_tests_pass() -> None:
    """Pass every `promtool test rules` file in tests/alerts/."""
    assert UNIT_TEST_FILES
    result = _run(PROMTOOL, "test", "rules", *map(str, UNIT_TEST_FILES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(UNIT_TEST_FILES), result.stdout


def test_every_alert_has_a_firing_case_and_a_silent_case() -> None:
    """Cover each alert in tests/alerts/ both ways: pinned labels when it fires, `exp_alerts: []` when not."""
    fires: dict[str, int] = {}
    silent: dict[str, int] = {}
    for path in UNIT_TEST_FILES:
        doc = yaml.safe_load(path.read_text())
        rule_files = {(path.parent / f).resolve() for f in doc["rule_files"]}
        assert rule_files <= {p.resolve() for p in RULE_FILES}, path
        for test in doc["tests"]:
            for case in test.get("alert_rule_test", []):
                expected = case.get("exp_alerts") or []
                target = fires if expected else silent
                target[case["alertname"]] = target.get(case["alertname"], 0) + 1
                for alert in expected:
                    assert "severity" in alert["exp_labels"], (path, case["alertname"])
                    assert set(alert["exp_annotations"]) >= {"summary", "description", "runbook_url"}
    for rule in _alerts():
        assert fires.get(rule["alert"]), f"{rule['alert']}: no test case where it fires"
        assert silent.get(rule["alert"]), f"{rule['alert']}: no test case where it must stay silent"


def test_unit_test_series_are_catalogue_names() -> None:
    """Feed the rule tests only series the exporter (or Prometheus) really produces, with real labels."""
    for path in UNIT_TEST_FILES:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for series in test.get("input_series", []):
                found = selectors(series["series"])
                assert len(found) == 1, series["series"]
                name, labels = found[0]
                assert name in known_names(), f"{path.name}: {name} is not in the catalogue"
                if name != "up":
                    assert labels == labels_of(name), f"{path.name}: {name} has labels {sorted(labels)}"


def test_rule_expressions_use_only_catalogue_names() -> None:
    """Select only catalogued names, recording rules and `up`, in expressions and annotation queries."""
    known = known_names()
    for rule in _rules():
        queries = [rule["expr"], *template_queries(str(rule.get("annotations", {})))]
        for query in queries:
            names = metric_names(query)
            assert names, f"{rule.get('alert') or rule.get('record')}: no metric in {query!r}"
            unknown = names - known
            assert not unknown, f"{rule.get('alert') or rule.get('record')}: unknown names {unknown}"


def test_rule_label_matchers_and_joins_use_real_labels() -> None:
    """Match and join only on labels the selected series carry."""
    recorded = recording_rule_names()
    for rule in _rules():
        for query in [rule["expr"], *template_queries(str(rule.get("annotations", {})))]:
            for name, labels in selectors(query):
                allowed = ALL_LABELS if name in recorded else labels_of(name)
                assert labels <= allowed, f"{name}: labels {labels - allowed} do not exist"
            assert grouping_labels(query) <= ALL_LABELS, query


def test_reason_values_in_rules_are_ones_the_exporter_emits() -> None:
    """Name only verdict reasons and clock-event reasons that the exporter knows."""
    known = set(REASONS) | {name for _, name in CLOCK_EVENT_REASONS}
    seen = set()
    for rule in _rules():
        for value in re.findall(r'reason="([^"]+)"', rule["expr"]):
            assert value in known, value
            seen.add(value)
    assert {"api_server_saturated", "cuda_graph_fallback"} <= seen


def test_clock_throttle_rule_catches_slowdowns_but_not_the_power_cap() -> None:
    """Match every hardware and thermal slowdown reason, and never sw_power_cap, gpu_idle or sync_boost."""
    rule = next(r for r in _alerts() if r["alert"] == "BoundwatchGPUClockThrottled")
    pattern = re.search(r'reason=~"([^"]+)"', rule["expr"]).group(1)
    matched = {name for _, name in CLOCK_EVENT_REASONS if re.fullmatch(pattern, name)}
    assert matched == {"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"}


def test_every_alert_has_severity_for_and_annotations() -> None:
    """Give each alert a severity, a `for`, a summary, a templated description and a runbook URL."""
    for rule in _alerts():
        name = rule["alert"]
        assert rule.get("labels", {}).get("severity") in SEVERITIES, name
        assert re.fullmatch(r"\d+[smh]", str(rule.get("for", ""))), f"{name}: no `for`"
        annotations = rule.get("annotations", {})
        assert annotations.get("summary", "").strip(), name
        assert "{{" in annotations.get("description", ""), f"{name}: description is not templated"
        assert annotations.get("runbook_url", "").startswith(RUNBOOK_URL), name
    severities = {rule["alert"]: rule["labels"]["severity"] for rule in _alerts()}
    assert severities["BoundwatchGPUStarvedWhileWorkPending"] == "critical"
    assert severities["BoundwatchAgentMissing"] == "info"


def test_every_runbook_anchor_exists_in_docs() -> None:
    """Point each runbook_url at a heading of docs/alerts.md, and document every alert there."""
    headings = re.findall(r"^#{1,6}\s+(.+)$", RUNBOOK.read_text(), flags=re.M)
    anchors = {_github_anchor(h) for h in headings}
    for rule in _alerts():
        anchor = rule["annotations"]["runbook_url"].rsplit("#", 1)[1]
        assert anchor in anchors, f"{rule['alert']}: #{anchor} is not a heading in {RUNBOOK.name}"
        assert anchor == rule["alert"].lower()


def test_rule_file_is_the_generators_output() -> None:
    """Keep alerts/boundwatch.rules.yml what tools/gen_alerts.py writes from its PARAMS (edit PARAMS, not the file)."""
    result = _run(sys.executable, str(GEN), "--check")
    assert result.returncode == 0, result.stderr


def test_every_alert_is_prefixed_and_every_series_selected_through_the_selector() -> None:
    """Name alerts Boundwatch*, and put the one configurable selector on every raw series (no job elsewhere)."""
    recorded = recording_rule_names()
    for rule in _rules():
        if "alert" in rule:
            assert rule["alert"].startswith("Boundwatch"), rule["alert"]
        for name, labels in selectors(rule["expr"]):
            if name not in recorded:
                assert "job" in labels, f"{rule.get('alert') or rule['record']}: {name} lacks the selector"
    text = RULE_FILES[0].read_text()
    assert text.count('job="') == text.count('job="boundwatch"')


@pytest.mark.prometheus
@needs_promtool
def test_generator_parameters_change_selector_joins_and_windows(tmp_path: Path) -> None:
    """Render with another selector, a cluster join label and short windows: valid rules that use all three."""
    out = tmp_path / "custom.rules.yml"
    args = ["--set", 'selector=job=~"gpu-.*"', "--set", "target_labels=cluster,instance,job"]
    args += ["--set", "rate_window=30s", "--set", "page_for=1m", "-o", str(out)]
    result = _run(sys.executable, str(GEN), *args)
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    assert 'job="boundwatch"' not in text
    assert 'job=~"gpu-.*"' in text and "on(cluster, instance, job, gpu)" in text and "[30s]" in text
    assert "[5m]" not in text
    check = _run(PROMTOOL, "check", "rules", str(out))
    assert check.returncode == 0, check.stdout + check.stderr


def test_alert_names_are_unique() -> None:
    """Define each alert and recording rule once."""
    names = [rule.get("alert") or rule["record"] for rule in _rules()]
    assert len(names) == len(set(names))


def test_docs_name_the_recording_rules() -> None:
    """List every recording rule in the runbook, so dashboards and humans can find them."""
    text = RUNBOOK.read_text()
    for name in recording_rule_names():
        assert f"`{name}`" in text, name


def test_runbook_file_is_where_the_rules_say(tmp_path: Path) -> None:
    """Keep docs/alerts.md at the path the runbook URLs name."""
    assert RUNBOOK.is_file()
    assert RUNBOOK_URL.endswith(str(RUNBOOK.relative_to(ROOT)) + "#")


# --- the example deployment in deploy/ ------------------------------------------------------------

AMTOOL = shutil.which("amtool")
DEPLOY = ROOT / "deploy"


@pytest.mark.prometheus
@needs_promtool
def test_example_prometheus_config_is_valid_with_the_rules(tmp_path: Path) -> None:
    """Pass `promtool check config` on deploy/prometheus.yml with the rule files beside it, as documented."""
    shutil.copy(DEPLOY / "prometheus.yml", tmp_path)
    for path in RULE_FILES:
        shutil.copy(path, tmp_path)
    result = _run(PROMTOOL, "check", "config", str(tmp_path / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(RULE_FILES)} rule files found" in result.stdout


def test_example_scrape_job_is_the_one_the_rules_select() -> None:
    """Name the example job as BoundwatchDown's selector does."""
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    down = next(r for r in _alerts() if r["alert"] == "BoundwatchDown")
    selected = re.search(r'job="([^"]+)"', down["expr"]).group(1)
    assert selected in jobs
    assert {Path(p).name for p in config["rule_files"]} == {p.name for p in RULE_FILES}


@pytest.mark.prometheus
@pytest.mark.skipif(AMTOOL is None, reason="amtool not installed")
@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (["severity=critical", "alertname=BoundwatchGPUStarvedWhileWorkPending"], "page"),
        (["severity=warning", "alertname=BoundwatchCPUQuotaThrottling"], "team-queue"),
        (["severity=info", "alertname=BoundwatchAgentMissing"], "quiet-log"),
    ],
)
def test_example_alertmanager_routes_by_severity(labels: list[str], receiver: str) -> None:
    """Route critical to the pager, warning to the queue and info to a quiet log."""
    check = _run(AMTOOL, "check-config", str(DEPLOY / "alertmanager.yml"))
    assert check.returncode == 0, check.stdout + check.stderr
    result = _run(AMTOOL, "config", "routes", "test", f"--config.file={DEPLOY / 'alertmanager.yml'}", *labels)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == receiver


def test_example_alertmanager_routes_every_severity_the_rules_use() -> None:
    """Give every severity in the rules a route (or the default) in deploy/alertmanager.yml."""
    config = yaml.safe_load((DEPLOY / "alertmanager.yml").read_text())
    routed = {m.split("=", 1)[1].strip('"') for r in config["route"]["routes"] for m in r["matchers"]}
    used = {rule["labels"]["severity"] for rule in _alerts()}
    assert used - routed <= {"warning"}  # warning goes to the default receiver
    assert config["route"]["receiver"] == "team-queue"
