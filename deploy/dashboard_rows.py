"""The panels of the Grafana dashboard (deploy/dashboard.py lays them out): one row per
question an operator asks, and the cache events drawn on every graph.

Expressions use the metric names of spoke/metrics.py and hub/serve/metrics.py, the recording
rules of deploy/prometheus/rules.yml, kube-state-metrics' and the kubelet's cAdvisor
series (the resource row), node_exporter's (the cache disk), and the variables
``$datasource`` and ``$node``: a regex over the spokes' ``node`` label, their node's name
(the ServiceMonitor copies it from the pod's node, deploy/prometheus/prometheus.yml from
the target's host), never a pod's address. The resource row finds a pod's node through
kube-state-metrics' ``kube_pod_info``.
"""

from __future__ import annotations

from typing import Any

NODE = 'node=~"$node"'
STRATA_PODS = 'pod=~"strata-(hub|spoke)-.+", container!="", container!="POD"'
"""cAdvisor's and kube-state-metrics' series of the hub's and spokes' containers."""
ON_NODE = (
    '* on (namespace, pod) group_left () max by (namespace, pod) (kube_pod_info{node=~"$node"})'
)
"""Keeps a per-pod series whose pod runs on a picked node (kube-state-metrics)."""
CACHE_DISK = 'mountpoint=~"/var/lib/strata(/cache)?", fstype!~"tmpfs|overlay"'
"""The cache's filesystem, as StrataCacheDiskShort selects it."""
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
                    f"histogram_quantile(0.5, sum by (node, le) "
                    f"(rate(strata_spoke_demand_miss_seconds_bucket{{{NODE}}}[$__rate_interval])))",
                    "p50 {{node}}",
                ),
                (
                    f"histogram_quantile(0.99, sum by (node, le) "
                    f"(rate(strata_spoke_demand_miss_seconds_bucket{{{NODE}}}[$__rate_interval])))",
                    "p99 {{node}}",
                ),
                desc="Time from a read that missed to its block arriving. Cache events are "
                "drawn as annotations: a spike that lines up with evictions or a full cache "
                "is the cache, one without them is the link or the hub.",
            ),
            timeseries(
                "Hub fetch latency p99 (one ReadBlocks stream)",
                "s",
                (f"strata:spoke_hub_fetch_seconds:p99_5m{{{NODE}}}", "{{node}}"),
            ),
            timeseries(
                "Miss ratio",
                "percentunit",
                (f"strata:spoke_miss_ratio:rate5m{{{NODE}}}", "{{node}}"),
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
                (f"strata:spoke_hub_fetch_bytes:rate1m{{{NODE}}}", "{{node}}"),
                ("sum(strata:hub_blocks_served_bytes:rate1m)", "hub sends (all spokes)"),
                desc="Compare with the link's rate: flat at the top is a full link.",
            ),
            timeseries(
                "Fetches in flight",
                "short",
                (f"strata_spoke_inflight_fetches{{{NODE}}}", "blocks {{node}}"),
                (f"strata_spoke_fetch_queue_depth{{{NODE}}}", "queued {{class}} {{node}}"),
            ),
            timeseries(
                "Bytes in flight",
                "bytes",
                (f"strata_spoke_fetch_inflight_bytes{{{NODE}}}", "{{node}}"),
            ),
            timeseries(
                "Prefetch: issued, used, wasted",
                "Bps",
                (
                    f"sum by (node) (rate(strata_spoke_prefetch_bytes_total{{{NODE}}}"
                    f"[$__rate_interval]))",
                    "issued {{node}}",
                ),
                (
                    f"sum by (node) (rate(strata_spoke_prefetch_used_bytes_total{{{NODE}}}"
                    f"[$__rate_interval]))",
                    "used {{node}}",
                ),
                (
                    f"sum by (node) (rate(strata_spoke_prefetch_wasted_bytes_total{{{NODE}}}"
                    f"[$__rate_interval]))",
                    "wasted {{node}}",
                ),
            ),
        ],
    ),
    (
        "Is the hub serving?",
        [
            timeseries(
                "Hub requests, by method and code",
                "reqps",
                (
                    "sum by (method, code) (rate(strata_hub_requests_total[$__rate_interval]))",
                    "{{method}} {{code}}",
                ),
                desc="gRPC calls finished on every replica. RESOURCE_EXHAUSTED: limit "
                "refusals; UNAVAILABLE: the catalog; UNAUTHENTICATED: tokens, certificates.",
            ),
            timeseries(
                "Block bytes the hub sends, per replica",
                "Bps",
                ("strata:hub_blocks_served_bytes:rate1m", "{{instance}}"),
                ("sum(strata:hub_blocks_served_bytes:rate1m)", "all replicas"),
            ),
            timeseries(
                "Replicas up and on the catalog",
                "percentunit",
                ("strata:hub_replicas_up:ratio", "answer scrapes"),
                ("strata:hub_catalog_up:ratio", "reach the catalog"),
                desc="Below 50 %: StrataHubDown or StrataHubCatalogDown pages; a replica "
                "out alone is StrataHubReplicaDown, a ticket.",
            ),
            timeseries(
                "Limit refusals, by limit",
                "reqps",
                (
                    "sum by (limit) (rate(strata_hub_limit_refusals_total[$__rate_interval]))",
                    "{{limit}}",
                ),
                desc="Calls refused RESOURCE_EXHAUSTED for a token's share (streams, bytes, "
                "grants) or a request that did not arrive in time (StrataHubLimitRefusals).",
            ),
            timeseries(
                "Streams open, and block bytes they hold",
                "short",
                ("sum by (method) (strata_hub_active_streams)", "{{method}}"),
                ("sum(strata_hub_read_bytes_held) / 1048576", "MiB held for ReadBlocks"),
                desc="Streaming calls in flight on all replicas, and the read budget in use "
                "(--max-bytes-in-flight per replica).",
            ),
        ],
    ),
    (
        "How warm is the cache?",
        [
            timeseries(
                "Hit ratio",
                "percentunit",
                (f"strata:spoke_hit_ratio:rate5m{{{NODE}}}", "{{node}}"),
            ),
            timeseries(
                "Cache use and pins",
                "percentunit",
                (f"strata:spoke_cache_used:ratio{{{NODE}}}", "used {{node}}"),
                (f"strata:spoke_cache_pinned:ratio{{{NODE}}}", "pinned {{node}}"),
            ),
            timeseries(
                "Evictions",
                "Bps",
                (
                    f"sum by (node) (rate(strata_spoke_evicted_bytes_total{{{NODE}}}"
                    f"[$__rate_interval]))",
                    "{{node}}",
                ),
            ),
            timeseries(
                "Background fill: bytes left",
                "bytes",
                (f"strata_spoke_fill_remaining_bytes{{{NODE}}}", "{{node}}"),
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
                (f"strata_spoke_mesh_nodes_live{{{NODE}}} > 0", "{{node}}"),
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
                    f"sum by (node) (increase(strata_spoke_peer_corrupt_blocks_total"
                    f"{{{NODE}}}[$__rate_interval]))",
                    "corrupt from a peer, at {{node}}",
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
        "Are Strata's pods within their resources?",
        [
            timeseries(
                "CPU, per container",
                "short",
                (
                    "sum by (pod, container) (rate(container_cpu_usage_seconds_total"
                    f"{{{STRATA_PODS}}}[$__rate_interval])) {ON_NODE}",
                    "{{pod}} {{container}}",
                ),
                desc="Cores used (cAdvisor). The spoke container has no CPU limit on purpose.",
            ),
            timeseries(
                "Memory against the limit",
                "percentunit",
                (
                    f"strata:container_memory_working_set:ratio_limit {ON_NODE}",
                    "{{pod}} {{container}}",
                ),
                desc="Working set over the limit (cAdvisor, kube-state-metrics): above 90 % "
                "for 15 minutes is StrataMemoryNearLimit; at 100 % the container is "
                "OOM-killed (StrataOOMKilled).",
            ),
            timeseries(
                "Container restarts",
                "short",
                (
                    "sum by (pod, container) (increase(kube_pod_container_status_restarts_total"
                    f"{{{STRATA_PODS}}}[$__rate_interval])) {ON_NODE}",
                    "{{pod}} {{container}}",
                ),
            ),
            timeseries(
                "Cache disk: free, and what the cache still takes",
                "bytes",
                (
                    f"max by (node) (node_filesystem_avail_bytes{{{CACHE_DISK}, {NODE}}})",
                    "free {{node}}",
                ),
                (
                    "max by (node) (0.95 * strata_spoke_cache_capacity_bytes"
                    f"{{{NODE}}} - strata_spoke_cache_used_bytes{{{NODE}}})",
                    "cache still takes {{node}}",
                ),
                desc="node_exporter's free space on the cache's filesystem against what the "
                "cache fills before it evicts: free below it is StrataCacheDiskShort.",
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
                    f"sum by (node) (increase(strata_spoke_corrupt_blocks_total{{{NODE}}}"
                    f"[$__rate_interval]))",
                    "corrupt {{node}}",
                ),
                (
                    f"sum by (node) (increase(strata_spoke_cache_full_total{{{NODE}}}"
                    f"[$__rate_interval]))",
                    "cache full {{node}}",
                ),
                (
                    f"sum by (node) (increase("
                    f"strata_spoke_streamed_through_blocks_total{{{NODE}}}[$__rate_interval]))",
                    "streamed through {{node}}",
                ),
            ),
            timeseries(
                "Hub fetch errors (retried), by gRPC code",
                "short",
                (
                    f"sum by (node, code) (increase("
                    f"strata_spoke_hub_fetch_errors_total{{{NODE}}}[$__rate_interval]))",
                    "{{code}} {{node}}",
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
                    f"sum by (node) (increase(strata_spoke_mount_restarts_total{{{NODE}}}"
                    f"[$__rate_interval]))",
                    "{{node}}",
                ),
            ),
        ],
    ),
]


ANNOTATIONS: list[tuple[str, str, str]] = [
    (
        "Evictions",
        f"sum by (node) (increase(strata_spoke_evicted_bytes_total{{{NODE}}}[1m])) > 0",
        "#8AB8FF",
    ),
    (
        "Cache full",
        f"sum by (node) (increase(strata_spoke_cache_full_total{{{NODE}}}[1m])) > 0",
        "#FF9830",
    ),
    (
        "Corrupt block",
        f"sum by (node) (increase(strata_spoke_corrupt_blocks_total{{{NODE}}}[1m])) > 0",
        "#F2495C",
    ),
    (
        "Mount restart",
        f"sum by (node) (increase(strata_spoke_mount_restarts_total{{{NODE}}}[1m])) > 0",
        "#F2495C",
    ),
    ("Hub unreachable", f"strata_spoke_hub_up{{{NODE}}} == 0", "#FADE2A"),
    (
        "Catalog changed (publish, tag, revoke)",
        f"changes(strata_spoke_watch_sequence{{{NODE}}}[1m]) > 0",
        "#73BF69",
    ),
]
