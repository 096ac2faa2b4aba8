"""The Grafana dashboard for Strata, generated: deploy/grafana/strata.json.

    python -m deploy.dashboard           # rewrite deploy/grafana/strata.json
    python -m deploy.dashboard --check   # exit 1 when the committed file is stale

One row per question an operator asks, top to bottom: is the GPU fed (miss latency,
miss ratio), is the link full (bytes from the hub against what the hub sends, fetches
in flight, prefetch), how warm is the cache (hit ratio, use, pins, evictions, fill
left), does the region's mesh share (bytes by source, live members, failed and lying
peers, refusals), is anything wrong (hub reachability, corrupt blocks, full cache,
restarts, errors, firing alerts). Cache events — evictions, a full cache, corrupt blocks,
mount restarts, the hub going away, a tag moving — are dashboard annotations, drawn on
every time series, so a latency spike lines up with what the cache did at that moment.

Expressions use the metric names of spoke/metrics.py and hub/metrics.py, the recording
rules of deploy/prometheus/rules.yml, and the variables ``$datasource`` and ``$node``
(a regex over spoke instances); tests/deploy/test_dashboard.py checks each name against
what a running hub and spoke export. The JSON follows Grafana's dashboard model
(https://grafana.com/docs/grafana/latest/dashboards/build-dashboards/view-dashboard-json-model/).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUTPUT = Path(__file__).resolve().parent / "grafana" / "strata.json"
NODE = 'instance=~"$node"'
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

Panel = dict[str, Any]


def _target(expr: str, legend: str, ref: str) -> dict[str, Any]:
    return {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": ref}


def timeseries(title: str, unit: str, *targets: tuple[str, str], desc: str = "") -> Panel:
    """A time-series panel; ``targets`` are (PromQL, legend) pairs."""
    return {
        "type": "timeseries",
        "title": title,
        "description": desc,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [_target(e, legend, chr(ord("A") + i)) for i, (e, legend) in enumerate(targets)],
    }


def stat(title: str, unit: str, expr: str, desc: str = "") -> Panel:
    """A single-number panel."""
    return {
        "type": "stat",
        "title": title,
        "description": desc,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value"},
        "targets": [_target(expr, "", "A")],
    }


ROWS: list[tuple[str, list[Panel]]] = [
    (
        "Is the GPU fed?",
        [
            timeseries(
                "Demand miss latency (what a reader waits for)",
                "s",
                (
                    f"histogram_quantile(0.5, sum by (instance, le) "
                    f"(rate(strata_spoke_demand_miss_seconds_bucket{{{NODE}}}[$__rate_interval])))",
                    "p50 {{instance}}",
                ),
                (
                    f"histogram_quantile(0.99, sum by (instance, le) "
                    f"(rate(strata_spoke_demand_miss_seconds_bucket{{{NODE}}}[$__rate_interval])))",
                    "p99 {{instance}}",
                ),
                desc="Time from a read that missed to its block arriving. Cache events are "
                "drawn as annotations: a spike that lines up with evictions or a full cache "
                "is the cache, one without them is the link or the hub.",
            ),
            timeseries(
                "Hub fetch latency p99 (one ReadBlocks stream)",
                "s",
                (f"strata:spoke_hub_fetch_seconds:p99_5m{{{NODE}}}", "{{instance}}"),
            ),
            timeseries(
                "Miss ratio",
                "percentunit",
                (f"strata:spoke_miss_ratio:rate5m{{{NODE}}}", "{{instance}}"),
                desc="Block reads that needed the hub. High and steady while a job runs: "
                "the working set does not fit, or nothing was prewarmed.",
            ),
        ],
    ),
    (
        "Is the link full?",
        [
            timeseries(
                "Bytes from the hub, per spoke",
                "Bps",
                (f"strata:spoke_hub_fetch_bytes:rate1m{{{NODE}}}", "{{instance}}"),
                ("sum(strata:hub_blocks_served_bytes:rate1m)", "hub sends (all spokes)"),
                desc="Compare with the link's rate: flat at the top is a full link.",
            ),
            timeseries(
                "Fetches in flight",
                "short",
                (f"strata_spoke_inflight_fetches{{{NODE}}}", "blocks {{instance}}"),
                (f"strata_spoke_fetch_queue_depth{{{NODE}}}", "queued {{class}} {{instance}}"),
            ),
            timeseries(
                "Bytes in flight",
                "bytes",
                (f"strata_spoke_fetch_inflight_bytes{{{NODE}}}", "{{instance}}"),
            ),
            timeseries(
                "Prefetch: issued, used, wasted",
                "Bps",
                (
                    f"sum by (instance) (rate(strata_spoke_prefetch_bytes_total{{{NODE}}}"
                    f"[$__rate_interval]))",
                    "issued {{instance}}",
                ),
                (
                    f"sum by (instance) (rate(strata_spoke_prefetch_used_bytes_total{{{NODE}}}"
                    f"[$__rate_interval]))",
                    "used {{instance}}",
                ),
                (
                    f"sum by (instance) (rate(strata_spoke_prefetch_wasted_bytes_total{{{NODE}}}"
                    f"[$__rate_interval]))",
                    "wasted {{instance}}",
                ),
            ),
        ],
    ),
    (
        "How warm is the cache?",
        [
            timeseries(
                "Hit ratio",
                "percentunit",
                (f"strata:spoke_hit_ratio:rate5m{{{NODE}}}", "{{instance}}"),
            ),
            timeseries(
                "Cache use and pins",
                "percentunit",
                (f"strata:spoke_cache_used:ratio{{{NODE}}}", "used {{instance}}"),
                (f"strata:spoke_cache_pinned:ratio{{{NODE}}}", "pinned {{instance}}"),
            ),
            timeseries(
                "Evictions",
                "Bps",
                (
                    f"sum by (instance) (rate(strata_spoke_evicted_bytes_total{{{NODE}}}"
                    f"[$__rate_interval]))",
                    "{{instance}}",
                ),
            ),
            timeseries(
                "Background fill: bytes left",
                "bytes",
                (f"strata_spoke_fill_remaining_bytes{{{NODE}}}", "{{instance}}"),
            ),
            stat(
                "Cached bytes (all spokes)",
                "bytes",
                f"sum(strata_spoke_cache_used_bytes{{{NODE}}})",
            ),
        ],
    ),
    (
        "Is the region's mesh sharing?",
        [
            timeseries(
                "Block bytes by source: hub or peer",
                "Bps",
                (
                    f"sum by (source) (rate(strata_spoke_source_bytes_total{{{NODE}}}"
                    f"[$__rate_interval]))",
                    "{{source}}",
                ),
                desc="With a working mesh each block crosses the WAN once per region: "
                "peer bytes grow with the number of spokes, hub bytes do not.",
            ),
            timeseries(
                "Live mesh members, as each spoke sees them",
                "short",
                (f"strata_spoke_mesh_nodes_live{{{NODE}}} > 0", "{{instance}}"),
                ('count(up{job="strata-spoke"} == 1)', "spokes up"),
                desc="Every line on 'spokes up'; one below it is a spoke that misses "
                "members (StrataMeshPartitioned).",
            ),
            timeseries(
                "Failed peer calls, by kind",
                "short",
                (
                    f"sum by (kind) (increase(strata_spoke_peer_errors_total{{{NODE}}}"
                    f"[$__rate_interval]))",
                    "{{kind}}",
                ),
                desc="Each fell back to the hub (StrataPeerErrors).",
            ),
            timeseries(
                "Lying peers: corrupt peer blocks and quarantines",
                "short",
                (
                    f"sum by (instance) (increase(strata_spoke_peer_corrupt_blocks_total"
                    f"{{{NODE}}}[$__rate_interval]))",
                    "corrupt from a peer, at {{instance}}",
                ),
                (
                    f"sum by (kind) (increase(strata_spoke_peer_quarantines_total{{{NODE}}}"
                    f"[$__rate_interval]))",
                    "quarantined: {{kind}}",
                ),
                desc="Blocks a peer served that failed their digest (dropped, fetched from "
                "the hub; StrataLyingPeer), and peers left out for a while.",
            ),
            timeseries(
                "Peer calls refused, by reason",
                "short",
                (
                    f"sum by (reason) (increase(strata_spoke_peer_refusals_total{{{NODE}}}"
                    f"[$__rate_interval]))",
                    "{{reason}}",
                ),
                desc="Callers without a valid token or read grant, or beyond the peer "
                "port's memory budget (they read from the hub).",
            ),
        ],
    ),
    (
        "Is anything wrong?",
        [
            stat(
                "Firing alerts",
                "short",
                'count(ALERTS{alertname=~"Strata.*", alertstate="firing"}) or vector(0)',
            ),
            stat(
                "Spokes that cannot reach the hub",
                "short",
                f"count(strata_spoke_hub_up{{{NODE}}} == 0) or vector(0)",
            ),
            timeseries(
                "Corrupt blocks, full-cache refusals, streamed-through blocks",
                "short",
                (
                    f"sum by (instance) (increase(strata_spoke_corrupt_blocks_total{{{NODE}}}"
                    f"[$__rate_interval]))",
                    "corrupt {{instance}}",
                ),
                (
                    f"sum by (instance) (increase(strata_spoke_cache_full_total{{{NODE}}}"
                    f"[$__rate_interval]))",
                    "cache full {{instance}}",
                ),
                (
                    f"sum by (instance) (increase("
                    f"strata_spoke_streamed_through_blocks_total{{{NODE}}}[$__rate_interval]))",
                    "streamed through {{instance}}",
                ),
            ),
            timeseries(
                "Hub fetch errors (retried), by gRPC code",
                "short",
                (
                    f"sum by (instance, code) (increase("
                    f"strata_spoke_hub_fetch_errors_total{{{NODE}}}[$__rate_interval]))",
                    "{{code}} {{instance}}",
                ),
            ),
            timeseries(
                "Hub calls that failed, by method and code",
                "reqps",
                (
                    'sum by (method, code) (rate(strata_hub_requests_total{code!="OK"}'
                    "[$__rate_interval]))",
                    "{{method}} {{code}}",
                ),
            ),
            timeseries(
                "Mount restarts",
                "short",
                (
                    f"sum by (instance) (increase(strata_spoke_mount_restarts_total{{{NODE}}}"
                    f"[$__rate_interval]))",
                    "{{instance}}",
                ),
            ),
        ],
    ),
]


ANNOTATIONS: list[tuple[str, str, str]] = [
    (
        "Evictions",
        f"sum by (instance) (increase(strata_spoke_evicted_bytes_total{{{NODE}}}[1m])) > 0",
        "#8AB8FF",
    ),
    (
        "Cache full",
        f"sum by (instance) (increase(strata_spoke_cache_full_total{{{NODE}}}[1m])) > 0",
        "#FF9830",
    ),
    (
        "Corrupt block",
        f"sum by (instance) (increase(strata_spoke_corrupt_blocks_total{{{NODE}}}[1m])) > 0",
        "#F2495C",
    ),
    (
        "Mount restart",
        f"sum by (instance) (increase(strata_spoke_mount_restarts_total{{{NODE}}}[1m])) > 0",
        "#F2495C",
    ),
    ("Hub unreachable", f"strata_spoke_hub_up{{{NODE}}} == 0", "#FADE2A"),
    (
        "Catalog changed (publish, tag, revoke)",
        f"changes(strata_spoke_watch_sequence{{{NODE}}}[1m]) > 0",
        "#73BF69",
    ),
]


def dashboard() -> dict[str, Any]:
    """The dashboard model (rows of panels on Grafana's 24-column grid)."""
    panels: list[Panel] = []
    y, next_id = 0, 1
    for title, row in ROWS:
        panels.append(
            {
                "type": "row",
                "title": title,
                "id": next_id,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        next_id, y = next_id + 1, y + 1
        width = 24 // len(row) if len(row) <= 4 else 8
        x = 0
        for panel in row:
            if x + width > 24:
                x, y = 0, y + 8
            panels.append({**panel, "id": next_id, "gridPos": {"h": 8, "w": width, "x": x, "y": y}})
            next_id, x = next_id + 1, x + width
        y += 8
    return {
        "title": "Strata",
        "uid": "strata-overview",
        "description": "Hub and spokes: is the GPU fed, is the link full, how warm is the "
        "cache, is anything wrong. Generated by python -m deploy.dashboard.",
        "tags": ["strata"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "label": "Prometheus",
                },
                {
                    "name": "node",
                    "type": "query",
                    "label": "Spoke",
                    "datasource": DATASOURCE,
                    "query": {
                        "query": "label_values(strata_spoke_cache_used_bytes, instance)",
                        "refId": "node",
                    },
                    "definition": "label_values(strata_spoke_cache_used_bytes, instance)",
                    "includeAll": True,
                    "multi": True,
                    "allValue": ".*",
                    "refresh": 2,
                },
            ]
        },
        "annotations": {
            "list": [
                {
                    "name": name,
                    "datasource": DATASOURCE,
                    "enable": True,
                    "expr": expr,
                    "iconColor": color,
                    "step": "1m",
                    "titleFormat": name,
                    "textFormat": "{{instance}}",
                    "useValueForTime": False,
                }
                for name, expr, color in ANNOTATIONS
            ]
        },
        "panels": panels,
    }


def render() -> str:
    """The dashboard as the JSON text committed in deploy/grafana/strata.json."""
    return json.dumps(dashboard(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["--check"]):
        print("usage: python -m deploy.dashboard [--check]", file=sys.stderr)
        return 2
    text = render()
    if args == ["--check"]:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT} is stale: run python -m deploy.dashboard", file=sys.stderr)
            return 1
        return 0
    OUTPUT.parent.mkdir(exist_ok=True)
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
