"""Pull metric names out of PromQL, and map them to catalogue families, for the rule and dashboard tests."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from exporter.catalogue import BY_NAME, METRICS

ROOT = Path(__file__).resolve().parents[2]
RULE_FILES = sorted((ROOT / "alerts").glob("*.yml"))

# Names Prometheus itself creates for every target.
PROMETHEUS_NAMES = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped", "ALERTS"})
ALL_LABELS = frozenset({label for spec in METRICS for label in spec.labels} | {"instance", "job", "le"})

_KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
)
_AGGREGATIONS = frozenset(
    {
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
    }
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_BRACES = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w:$.])([A-Za-z_:][A-Za-z0-9_:]*)(?![\w:])(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """Return the metric names an expression selects (not functions, keywords, labels or strings)."""
    text = _STRING.sub('""', expr)
    text = _BRACES.sub("{}", text)
    text = _RANGE.sub("[]", text)
    text = _LABEL_LIST.sub(r"\1()", text)
    names = set()
    for match in _IDENT.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name in _KEYWORDS or name in _AGGREGATIONS or name.lower() in {"inf", "nan"}:
            continue
        names.add(name)
    return names


_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^{}]*)\}")
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$", re.S)


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """Return (metric name, label names matched) for each `name{...}` selector in an expression."""
    text = _STRING.sub('""', expr)
    return [(m.group(1), set(_MATCHER.findall(m.group(2)))) for m in _SELECTOR.finditer(text)]


def grouping_labels(expr: str) -> set[str]:
    """Return the label names in by/without/on/ignoring/group_left/group_right lists."""
    text = _STRING.sub('""', expr)
    return {label.strip() for lst in _LABEL_LISTS.findall(text) for label in lst.split(",") if label.strip()}


def label_values_query(query: str) -> tuple[str, str] | None:
    """Split a Grafana `label_values(expr, label)` variable query into (expr, label)."""
    match = _LABEL_VALUES.match(query)
    return (match.group(1), match.group(2)) if match else None


def exposed_names() -> dict[str, str]:
    """Map every sample name the exporter exposes (`_bucket`, `_sum`, ... included) to its family."""
    out: dict[str, str] = {}
    for spec in METRICS:
        out[spec.name] = spec.name
        for name in spec.exposed_names:
            out[name] = spec.name
    return out


def labels_of(name: str) -> set[str]:
    """Return the labels a series of this sample name carries once scraped (target labels included)."""
    if name == "ALERTS":
        return set(ALL_LABELS) | {"alertname", "alertstate", "severity"}
    if name in PROMETHEUS_NAMES:
        return {"instance", "job"}
    family = exposed_names()[name]
    labels = set(BY_NAME[family].labels) | {"instance", "job"}
    if name.endswith("_bucket") and BY_NAME[family].kind == "histogram":
        labels.add("le")
    return labels


def load_rule_groups() -> list[dict]:
    """Return every rule group of every file in alerts/."""
    groups: list[dict] = []
    for path in RULE_FILES:
        groups.extend(yaml.safe_load(path.read_text())["groups"])
    return groups


def recording_rule_names() -> set[str]:
    """Return the names the recording rules in alerts/ define."""
    return {rule["record"] for group in load_rule_groups() for rule in group["rules"] if "record" in rule}


def known_names() -> set[str]:
    """Return every name a query may select: catalogue samples, recording rules, Prometheus' own."""
    return set(exposed_names()) | recording_rule_names() | PROMETHEUS_NAMES


def template_queries(text: str) -> list[str]:
    """Return the PromQL inside `printf "..." ... | query` calls of an alert template."""
    return [
        bytes(q, "utf-8").decode("unicode_escape") for q in re.findall(r'printf\s+"((?:[^"\\]|\\.)*)"', text)
    ]


def gen_alerts() -> Any:
    """Return tools/gen_alerts.py as a module (it renders the rule file from its PARAMS)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_alerts", ROOT / "tools" / "gen_alerts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
