"""Write boundwatch's alert and recording rules from one set of parameters (mixin style).

    python tools/gen_alerts.py                      # rewrite alerts/boundwatch.rules.yml from PARAMS
    python tools/gen_alerts.py --set selector='job=~"gpu-.*"' --set page_for=15m -o my.rules.yml
    python tools/gen_alerts.py --check              # exit 1 if the committed file is not PARAMS' output

Every selector, join label, window, `for` and threshold is a key of PARAMS (documented in
docs/alerts.md); tests/test_alerts.py checks the committed file is this script's output.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "alerts" / "boundwatch.rules.yml"

PARAMS: dict[str, Any] = {
    # Matcher added to every boundwatch series (and to `up`): which scrape jobs are boundwatch.
    "selector": 'job="boundwatch"',
    # Labels that tell one boundwatch target from another; every join is on these (+ gpu or cgroup).
    # Add "cluster" etc. when your Prometheus adds them as external or target labels.
    "target_labels": ("instance", "job"),
    # Range of every rate() (the recording rules keep their `rate5m` names whatever it is).
    "rate_window": "5m",
    # The page: BoundwatchGPUStarvedWhileWorkPending.
    "page_for": "10m",
    "page_busy_below": 0.5,  # best-source busy share
    "page_host_bound_above": 0.5,  # share of time idle while work was offered to the GPU's engine
    "page_min_waiting": 0.5,  # demand gate: mean requests waiting on the host's engines, or
    "page_min_running": 4,  # mean requests running (one streaming request at night is not a page), or
    # an API server saturated for this share of the window (requests queue in front of the engine).
    "page_min_api_saturated": 0.5,
    "api_server_for": "5m",
    "throttled_periods_above": 0.25,  # kubernetes-mixin CPUThrottlingHigh
    "throttled_cores_above": 0.1,  # CPU-seconds lost per second
    "throttling_for": "10m",
    "graph_fallback_for": "10m",
    "clock_for": "10m",
    "source_down_for": "5m",
    "agent_missing_for": "30m",
    "agent_lookback": "24h",  # an agent that ran within this long and stopped is missing
    "unsent_for": "15m",  # agents dropping messages (the sidecar's socket queue full) this long
    "refused_for": "15m",  # inputs left unread past a bound, or refused, this long
    "down_for": "5m",
    "runbook": "https://github.com/boundwatch/boundwatch/blob/main/docs/alerts.md",
}


def _sel(p: Mapping[str, Any], extra: str = "") -> str:
    parts = [m for m in (p["selector"], extra) if m]
    return "{" + ",".join(parts) + "}" if parts else ""


def _eq(label: str, value: str, op: str = "=") -> str:
    return f'{label}{op}"{value}"'


def _on(p: Mapping[str, Any], *more: str) -> str:
    return ", ".join((*p["target_labels"], *more))


def _q(p: Mapping[str, Any], metric: str, *labels: str, wrap: str = "{}") -> str:
    """Return a printf'd annotation query for a metric at the alert's own target (and labels)."""
    keys = (*p["target_labels"], *labels)
    matchers = ",".join(f"{k}=%q" for k in keys)
    args = " ".join(f"$labels.{k}" for k in keys)
    return f'printf "{wrap.format(metric + "{" + matchers + "}")}" {args}'


def recording(p: Mapping[str, Any]) -> list[dict[str, str]]:
    """Return the recording rules."""
    w, on = p["rate_window"], _on(p, "gpu")
    s = lambda extra="": _sel(p, extra)  # noqa: E731
    return [
        {
            "comment": "GPU busy share by source. Divided by (observed > 0): a source that stopped counting\n"
            "(an agent that exited or stepped aside for a profiler) drops out instead of giving 0/0 = NaN,\n"
            "which would still win the `or` below and silence the page.",
            "record": "instance_gpu_source:boundwatch_gpu_busy:ratio_rate5m",
            "expr": f"rate(boundwatch_gpu_busy_seconds_total{s()}[{w}])\n"
            f"/ (rate(boundwatch_gpu_observed_seconds_total{s()}[{w}]) > 0)",
        },
        {
            "comment": "The best busy figure per GPU, keeping its `source` label: CUPTI where an agent counts,\n"
            "else NVML GPM, else NVML utilization.",
            "record": "instance_gpu:boundwatch_gpu_busy:ratio_rate5m",
            "expr": 'instance_gpu_source:boundwatch_gpu_busy:ratio_rate5m{source="cupti"}\n'
            f"or on({on})\n"
            'instance_gpu_source:boundwatch_gpu_busy:ratio_rate5m{source="gpm"}\n'
            f"or on({on})\n"
            'instance_gpu_source:boundwatch_gpu_busy:ratio_rate5m{source="nvml"}',
        },
        {
            "comment": "Share of wall time the GPU sat idle while work was offered to its own engine.",
            "record": "instance_gpu:boundwatch_host_bound:ratio_rate5m",
            "expr": f"rate(boundwatch_host_bound_seconds_total{s()}[{w}])",
        },
        {
            "comment": "Share of CUPTI busy time inside CUDA-graph launches (needs the agent).",
            "record": "instance_gpu:boundwatch_gpu_graph_busy:ratio_rate5m",
            "expr": f"rate(boundwatch_gpu_graph_busy_seconds_total{s()}[{w}])\n/ ignoring(source)\n"
            f"(rate(boundwatch_gpu_busy_seconds_total{s(_eq('source', 'cupti'))}[{w}]) > 0)",
        },
        {
            "comment": "Mean requests running / waiting per engine (exact, from the integrating counters).",
            "record": "instance_engine:boundwatch_engine_requests_running:rate5m",
            "expr": f"rate(boundwatch_engine_running_request_seconds_total{s()}[{w}])",
        },
        {
            "record": "instance_engine:boundwatch_engine_requests_waiting:rate5m",
            "expr": f"rate(boundwatch_engine_waiting_request_seconds_total{s()}[{w}])",
        },
        {
            "comment": "Share of CFS quota periods in which a cgroup was throttled.",
            "record": "instance_cgroup:boundwatch_cgroup_cpu_throttled_periods:ratio_rate5m",
            "expr": f"rate(boundwatch_cgroup_cpu_throttled_periods_total{s()}[{w}])\n"
            f"/ (rate(boundwatch_cgroup_cpu_periods_total{s()}[{w}]) > 0)",
        },
        {
            "comment": "GPUs per verdict, per target: the fleet dashboard's counts.",
            "record": "instance_verdict:boundwatch_gpus:count",
            "expr": f"sum by ({_on(p, 'verdict')}) (boundwatch_bound{s()})",
        },
        {
            "comment": "Idle GPU-seconds per second with work offered, per target: lost GPU capacity.",
            "record": "instance:boundwatch_host_bound_gpus:rate5m",
            "expr": f"sum by ({_on(p)}) (instance_gpu:boundwatch_host_bound:ratio_rate5m)",
        },
    ]


def _runbook(p: Mapping[str, Any], name: str) -> str:
    return f"{p['runbook']}#{name.lower()}"


def _page(p: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Return the page: a GPU starved while its engine has work pending."""
    w, tl, s = p["rate_window"], _on(p), lambda extra="": _sel(p, extra)
    gpu_on = _on(p, "gpu")
    page = "BoundwatchGPUStarvedWhileWorkPending"
    demand = (
        f"(\n  sum by ({tl}) (instance_engine:boundwatch_engine_requests_waiting:rate5m) > {p['page_min_waiting']}\n"
        f"  or sum by ({tl}) (instance_engine:boundwatch_engine_requests_running:rate5m) >= {p['page_min_running']}\n"
        f"  or max by ({tl}) (avg_over_time(boundwatch_bound_reason{s(_eq('reason', 'api_server_saturated'))}[{w}]))"
        f" >= {p['page_min_api_saturated']}\n)"
    )
    return [
        {
            "comment": "Busy below the line (best source, `source` dropped so a cupti -> gpm switch keeps the\n"
            "alert), idle with the GPU's own engine running requests, and demand on the host: work\n"
            "waiting, a full enough batch, or an API server saturated in front of the engine.",
            "alert": page,
            "expr": f"max without (source) (instance_gpu:boundwatch_gpu_busy:ratio_rate5m) < {p['page_busy_below']}\n"
            f"and on({gpu_on})\ninstance_gpu:boundwatch_host_bound:ratio_rate5m > {p['page_host_bound_above']}\n"
            f"and on({tl})\n{demand}",
            "for": p["page_for"],
            "severity": "critical",
            "summary": "GPU starved while its engine has work pending.",
            "description": (
                f"GPU {{{{ $labels.gpu }}}} on {{{{ $labels.instance }}}} was busy {{{{ $value | humanizePercentage }}}}\n"
                f'({{{{ with {_q(p, "instance_gpu:boundwatch_gpu_busy:ratio_rate5m", "gpu")} | query }}}}{{{{ . | first | label "source" }}}}{{{{ end }}}}) over the last {w} and sat idle with work offered\n'
                f"{{{{ with {_q(p, 'instance_gpu:boundwatch_host_bound:ratio_rate5m', 'gpu')} | query }}}}{{{{ . | first | value | humanizePercentage }}}}{{{{ end }}}}\n"
                "of the time: the host, not the GPU, limits throughput. Reasons now:\n"
                f'{{{{ range $i, $r := {_q(p, "boundwatch_bound_reason", "gpu", wrap="{} == 1")} | query | sortByLabel "reason" }}}}{{{{ if $i }}}}, {{{{ end }}}}{{{{ $r.Labels.reason }}}}{{{{ else }}}}none reported{{{{ end }}}}.'
            ),
        },
    ]


def _causes(p: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Return the host-side and GPU-side cause alerts."""
    w, tl, s = p["rate_window"], _on(p), lambda extra="": _sel(p, extra)
    gpu_on = _on(p, "gpu")  # noqa: F841
    return [
        {
            "comment": "One alert per target: the API servers feed every GPU of an engine. Value: GPUs affected.",
            "alert": "BoundwatchHostBoundAPIServerSaturated",
            "expr": f"count by ({tl}) (boundwatch_bound_reason{s(_eq('reason', 'api_server_saturated'))} == 1)",
            "for": p["api_server_for"],
            "severity": "warning",
            "summary": "An API server's busiest thread is saturated and starves the GPUs.",
            "description": (
                "{{ $value }} GPU(s) on {{ $labels.instance }} are host-bound because an API-server\n"
                "process cannot feed the engine; busiest API-server thread at\n"
                f"{{{{ with {_q(p, 'boundwatch_api_server_cpu_ratio', wrap='max({})')} | query }}}}{{{{ . | first | value | humanizePercentage }}}}{{{{ end }}}}\n"
                "of a core. Add API servers (--api-server-count) and the cores to run them."
            ),
        },
        {
            "comment": "Both: many periods throttled and real CPU time lost; the sidecar's own cgroup excluded.",
            "alert": "BoundwatchCPUQuotaThrottling",
            "expr": f"instance_cgroup:boundwatch_cgroup_cpu_throttled_periods:ratio_rate5m > {p['throttled_periods_above']}\n"
            f"and on({_on(p, 'cgroup')})\n"
            f"rate(boundwatch_cgroup_cpu_throttled_seconds_total{s()}[{w}]) > {p['throttled_cores_above']}\n"
            f"unless on({_on(p, 'cgroup')})\nboundwatch_self_cgroup_info{s()}",
            "for": p["throttling_for"],
            "severity": "warning",
            "summary": "An inference cgroup is throttled by its CPU quota.",
            "description": (
                "cgroup {{ $labels.cgroup }} on {{ $labels.instance }} was throttled in\n"
                f"{{{{ $value | humanizePercentage }}}} of its CFS periods over the last {w} (quota\n"
                f"{{{{ with {_q(p, 'boundwatch_cgroup_cpu_quota_cores', 'cgroup')} | query }}}}{{{{ . | first | value }}}} cores{{{{ else }}}}unknown{{{{ end }}}}).\n"
                "API servers and the engine loop lose CPU time while the GPU waits."
            ),
        },
        {
            "alert": "BoundwatchCUDAGraphFallback",
            "expr": f"boundwatch_bound_reason{s(_eq('reason', 'cuda_graph_fallback'))} == 1",
            "for": p["graph_fallback_for"],
            "severity": "warning",
            "summary": "Decode steps run eager instead of inside CUDA graphs.",
            "description": (
                "GPU {{ $labels.gpu }} on {{ $labels.instance }} is host-bound with\n"
                # the light agent's share of steps, else CUPTI's share of busy time, else the flags
                f"{{{{ with {_q(p, 'boundwatch_bound_graph_step_ratio', 'gpu')} | query }}}}{{{{ . | first | value | humanizePercentage }}}} of its engine steps"
                f"{{{{ else }}}}{{{{ with {_q(p, 'instance_gpu:boundwatch_gpu_graph_busy:ratio_rate5m', 'gpu')} | query }}}}{{{{ . | first | value | humanizePercentage }}}} of its busy time"
                "{{ else }}too few of its steps (the engine's flags){{ end }}{{ end }}\n"
                "inside CUDA graphs: batches above the capture size fall back to eager launches. The\n"
                "capture size counts tokens, seqs x (1 + spec depth)."
            ),
        },
        {
            "comment": "sw_power_cap is left out on purpose: a GPU at its power limit under load is normal.",
            "alert": "BoundwatchGPUClockThrottled",
            "expr": f"boundwatch_gpu_clock_event_reason{s(_eq('reason', 'hw_.*|sw_thermal.*', '=~'))} == 1",
            "for": p["clock_for"],
            "severity": "warning",
            "summary": "A GPU's clocks are held down by a thermal or hardware slowdown.",
            "description": (
                "GPU {{ $labels.gpu }} on {{ $labels.instance }} has reported clock-event reason\n"
                f"{{{{ $labels.reason }}}} for {p['clock_for']}; SM clock now\n"
                f"{{{{ with {_q(p, 'boundwatch_gpu_sm_clock_hertz', 'gpu')} | query }}}}{{{{ . | first | value | humanize }}}}Hz{{{{ else }}}}not reported{{{{ end }}}}.\n"
                "Check cooling, power delivery and `nvidia-smi -q -d PERFORMANCE`."
            ),
        },
    ]


def _health(p: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Return the alerts about boundwatch itself."""
    w, tl, s = p["rate_window"], _on(p), lambda extra="": _sel(p, extra)
    gpu_on = _on(p, "gpu")
    return [
        {
            "comment": "Down and failing: a source left out by configuration exports no series, and one whose\n"
            "party is absent (no GPU, no engine) is down without counting errors, so neither alerts.",
            "alert": "BoundwatchSourceDown",
            "expr": f"boundwatch_source_up{s()} == 0\nand on({_on(p, 'source')})\n"
            f"increase(boundwatch_source_errors_total{s()}[{w}]) > 0",
            "for": p["source_down_for"],
            "severity": "warning",
            "summary": "A boundwatch source keeps failing.",
            "description": (
                "Source {{ $labels.source }} on {{ $labels.instance }} has failed its reads for\n"
                f'{p["source_down_for"]}; the verdicts that need it read "unknown". The daemon\'s log says why\n'
                "(journalctl -u boundwatch)."
            ),
        },
        {
            "comment": "An agent reported for this GPU within the lookback and none runs now, on a target that\n"
            "runs an engine. Hosts that run without the agent by design never had one: silent.",
            "alert": "BoundwatchAgentMissing",
            "expr": f"max_over_time(boundwatch_agents{s(_eq('state', 'running'))}[{p['agent_lookback']}]) > 0\n"
            f"unless on({gpu_on}) (boundwatch_agents{s(_eq('state', 'running|quiet', '=~'))} > 0)\n"
            f"and on({tl}) boundwatch_engine_info{s()}",
            "for": p["agent_missing_for"],
            "severity": "info",
            "summary": "The boundwatch agent stopped reporting for a GPU that serves an engine.",
            "description": (
                "GPU {{ $labels.gpu }} on {{ $labels.instance }} had a boundwatch agent running within\n"
                f"{p['agent_lookback']} and has none now: idle gaps, the CUDA-graph share and exact step times are\n"
                "missing, and busy time comes from NVML."
            ),
        },
        {
            "comment": "Agents dropping messages rather than block: the sidecar's socket queue (net.unix.max_dgram_qlen)\n"
            "fills when many agents send at once. The gauge counts since each agent started: a rise is new drops.",
            "alert": "BoundwatchAgentMessagesDropped",
            "expr": f"delta(boundwatch_agent_unsent_messages{s()}[{w}]) > 0",
            "for": p["unsent_for"],
            "severity": "info",
            "summary": "boundwatch agents keep dropping messages they could not send.",
            "description": (
                "The agents on GPU {{ $labels.gpu }} of {{ $labels.instance }} dropped messages for\n"
                f"{p['unsent_for']} ({{{{ $value | humanize }}}} in the last {w}): the sidecar's socket queue was full, so step\n"
                "counts and graph shares there lag or miss windows. Raise net.unix.max_dgram_qlen on the host."
            ),
        },
        {
            "comment": "Inputs from outside left unread past a bound or refused (counted, never used), for long:\n"
            "the figures drawn from them are partial. One burst does not alert; a bound hit for good does.",
            "alert": "BoundwatchInputsRefused",
            "expr": f"max by ({tl}) (boundwatch_source_over_bound{s()}) > 0\n"
            f"or max by ({tl}) (boundwatch_engine_flags_refused{s()}) > 0\n"
            f"or sum by ({tl}) (increase(boundwatch_engine_page_refused_total{s()}[{w}])) > 0\n"
            f"or sum by ({tl}) (increase(boundwatch_agent_refused_total{s()}[{w}])) > 0\n"
            f"or sum by ({tl}) (increase(boundwatch_agent_bad_messages_total{s()}[{w}])) > 0",
            "for": p["refused_for"],
            "severity": "info",
            "summary": "boundwatch keeps leaving inputs unread or refusing them.",
            "description": (
                f"boundwatch on {{{{ $labels.instance }}}} has for {p['refused_for']} left inputs unread past its bounds\n"
                "or refused them (engines or processes past discovery's caps, bad values or oversized reads\n"
                "on an engine's page, agent datagrams out of bounds, engine flags it could not read): the\n"
                "figures drawn from them are partial. The runbook names the counters that say which."
            ),
        },
        {
            "comment": "Per target down, or no target up at all (all left service discovery): kubernetes-mixin.",
            "alert": "BoundwatchDown",
            "expr": f"up{s()} == 0\nor absent(up{s()} == 1)",
            "for": p["down_for"],
            "severity": "warning",
            "summary": "Prometheus cannot scrape boundwatch.",
            "description": (
                "{{ with $labels.instance }}{{ . }} (job {{ $labels.job }}){{ else }}Every target"
                f" matching {{{p['selector']}}}{{{{ end }}}}\nhas been down for {p['down_for']}: no verdicts and no"
                " GPU-starvation alerts there until it is back."
            ),
        },
    ]


def alerts(p: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Return the alerting rules."""
    return [*_page(p), *_causes(p), *_health(p)]


def _block(text: str, indent: int) -> str:
    pad = " " * indent
    return "|\n" + "\n".join(pad + line if line else "" for line in text.splitlines())


def _folded(text: str, indent: int) -> str:
    pad = " " * indent
    return ">-\n" + "\n".join(pad + line for line in text.splitlines())


def _comment(rule: Mapping[str, Any], indent: int) -> list[str]:
    return [" " * indent + "# " + line for line in rule.get("comment", "").splitlines()]


def render(overrides: Mapping[str, Any] | None = None) -> str:
    """Return the rule file for PARAMS updated with overrides."""
    p = {**PARAMS, **(overrides or {})}
    lines = [
        "# boundwatch alert and recording rules: GENERATED by tools/gen_alerts.py from its PARAMS",
        "# (selector, join labels, windows, `for`s, thresholds; docs/alerts.md). Edit PARAMS, not this file.",
        f"# selector: {p['selector'] or '(none)'}; joins on: {', '.join(p['target_labels'])}; rate window: {p['rate_window']}",
        "",
        "groups:",
        "  - name: boundwatch.recording",
        "    rules:",
    ]
    for rule in recording(p):
        lines += _comment(rule, 6)
        lines += [f"      - record: {rule['record']}", f"        expr: {_block(rule['expr'], 10)}", ""]
    lines += ["  - name: boundwatch.alerts", "    rules:"]
    for rule in alerts(p):
        lines += _comment(rule, 6)
        lines += [
            f"      - alert: {rule['alert']}",
            f"        expr: {_block(rule['expr'], 10)}",
            f"        for: {rule['for']}",
            "        labels:",
            f"          severity: {rule['severity']}",
            "        annotations:",
            f"          summary: {rule['summary']}",
            f"          description: {_folded(rule['description'], 12)}",
            f"          runbook_url: {_runbook(p, rule['alert'])}",
            "",
        ]
    return "\n".join(lines).rstrip() + "\n"


def _value(text: str) -> Any:
    if text.replace(".", "", 1).isdigit():
        return float(text) if "." in text else int(text)
    if "," in text and "=" not in text:
        return tuple(t.strip() for t in text.split(",") if t.strip())
    return text


def main(argv: list[str] | None = None) -> int:
    """Write (or check) the rule file."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--output", type=Path, default=OUT)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a PARAMS key")
    ap.add_argument("--check", action="store_true", help="exit 1 if the output file differs")
    args = ap.parse_args(argv)
    overrides: dict[str, Any] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or key not in PARAMS:
            ap.error(f"--set {item!r}: expected KEY=VALUE with KEY one of {', '.join(PARAMS)}")
        overrides[key] = _value(value)
    text = render(overrides)
    if args.check:
        same = args.output.is_file() and args.output.read_text() == text
        if not same:
            print(
                f"{args.output} is not tools/gen_alerts.py's output: run python tools/gen_alerts.py",
                file=sys.stderr,
            )
        return 0 if same else 1
    args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
