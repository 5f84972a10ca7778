"""The extender's own Prometheus metrics, on a registry per app (tests build many apps in one process)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Filter/prioritize take well under a millisecond for small clusters and a few for thousands of nodes.
_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class Telemetry:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.request_seconds = Histogram(
            "gpufleet_extender_request_duration_seconds",
            "Time spent deciding, per verb: request body in hand to answer encoded.",
            ["verb"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._request_children: dict[str, Histogram] = {}
        self.bad_requests = Counter(
            "gpufleet_extender_bad_requests_total",
            "Verb requests answered with anything but 200 (4xx refusals, 500 bugs), per verb and HTTP status.",
            ["verb", "status"],
            registry=self.registry,
        )
        self.decisions = Counter(
            "gpufleet_extender_filter_decisions_total",
            "Filter verdicts per node, by outcome (pass, overloaded, missing_metrics_allowed, ...).",
            ["outcome"],
            registry=self.registry,
        )
        self.metrics_age = Gauge(
            "gpufleet_extender_metrics_age_seconds",
            "Age of the newest GPU sample in the snapshot (+Inf while there is none).",
            registry=self.registry,
        )
        self.source_errors = Counter(
            "gpufleet_extender_metrics_source_errors_total",
            "Failed refreshes of the metrics snapshot, per source.",
            ["source"],
            registry=self.registry,
        )
        self.metrics_faults = Counter(
            "gpufleet_extender_metrics_faults_total",
            "Faults in data a refresh delivered, per source and kind (out_of_range, future_timestamp: series "
            "left out; duplicate_series, no_dcgm_series: reported only).",
            ["source", "fault"],
            registry=self.registry,
        )
        self.nodes_with_metrics = Gauge(
            "gpufleet_extender_nodes_with_metrics",
            "Nodes present in the current metrics snapshot.",
            registry=self.registry,
        )
        self.assumed_pods = Gauge(
            "gpufleet_extender_inflight_assumed_pods",
            "Recently bound GPU pods counted as load until a newer sample covers them.",
            registry=self.registry,
        )
        self.metrics_ready = Gauge(
            "gpufleet_extender_ready",
            "1 while /readyz answers 200 (fresh metrics or ON_MISSING_METRICS=allow, and no watch refused).",
            registry=self.registry,
        )
        self.metrics_blind = Gauge(
            "gpufleet_extender_metrics_blind",
            "1 while decisions use no GPU metrics (none loaded, or all older than METRICS_MAX_AGE_SECONDS).",
            registry=self.registry,
        )
        self.metrics_stale_nodes = Gauge(
            "gpufleet_extender_metrics_stale_nodes",
            "Nodes whose newest GPU sample is older than METRICS_MAX_AGE_SECONDS while others' are not: decisions "
            "use no metrics there (ON_MISSING_METRICS decides). 0 while the whole snapshot is stale (that is "
            "gpufleet_extender_metrics_blind).",
            registry=self.registry,
        )
        self.kube_api_errors = Counter(
            "gpufleet_extender_kube_api_errors_total",
            "Failed lists and watches of the Kubernetes API, per kind and HTTP status (error: no HTTP answer).",
            ["kind", "status"],
            registry=self.registry,
        )
        self.remote_write_refused = Counter(
            "gpufleet_extender_remote_write_refused_total",
            "Remote writes refused whole, per reason "
            "(malformed, too_large, unauthenticated, unsupported_media, method, internal).",
            ["reason"],
            registry=self.registry,
        )
        self.remote_write_samples = Counter(
            "gpufleet_extender_remote_write_samples_total",
            "Samples of the series the decision reads that remote writes delivered and the store took.",
            registry=self.registry,
        )
        self.remote_write_out_of_order = Counter(
            "gpufleet_extender_remote_write_out_of_order_total",
            "Samples of remote writes older than the sample held for their series: ignored.",
            registry=self.registry,
        )
        self.remote_write_over_limit = Counter(
            "gpufleet_extender_remote_write_series_over_limit_total",
            "Samples of new series not kept because the receiver holds its most series already: Prometheus' "
            "write_relabel_configs let through more than the dcgm series a decision reads.",
            registry=self.registry,
        )

        self.scoring_strategy = Gauge(
            "gpufleet_extender_scoring_strategy",
            "1 for the SCORING_STRATEGY in use (spread, pack or auto).",
            ["strategy"],
            registry=self.registry,
        )
        self.scoring_mode = Gauge(
            "gpufleet_extender_scoring_mode",
            "SCORING_STRATEGY=auto: 1 for the mode in force per resource (pack or spread), 0 for the other.",
            ["resource", "mode"],
            registry=self.registry,
        )
        self.scoring_mode_switches = Counter(
            "gpufleet_extender_scoring_mode_switches_total",
            "SCORING_STRATEGY=auto: switches of a resource's mode, by the mode switched to.",
            ["resource", "mode"],
            registry=self.registry,
        )
        self.fleet_mean_load = Gauge(
            "gpufleet_extender_fleet_mean_load",
            "SCORING_STRATEGY=auto: mean device load per resource over the fleet, the input of the mode choice.",
            ["resource"],
            registry=self.registry,
        )

    def show_modes(self, modes: Mapping[str, str], fleet_load: Mapping[str, float], changed: Iterable[str]) -> None:
        """Export auto's state after a snapshot: the mode per resource, the load it was chosen on, the switches."""
        for resource, mode in modes.items():
            for name in ("pack", "spread"):
                self.scoring_mode.labels(resource, name).set(1.0 if name == mode else 0.0)
        for resource, load in fleet_load.items():
            self.fleet_mean_load.labels(resource).set(load)
        for resource in changed:
            self.scoring_mode_switches.labels(resource, modes[resource]).inc()

    def observe_request(self, verb: str, seconds: float) -> None:
        """The request_seconds histogram of ``verb`` (children cached: ``labels()`` takes a lock per call)."""
        child = self._request_children.get(verb)
        if child is None:
            child = self._request_children[verb] = self.request_seconds.labels(verb)
        child.observe(seconds)

    def bind_live_values(
        self,
        metrics_age: Callable[[], float],
        ready: Callable[[], bool],
        blind: Callable[[], bool] = lambda: False,
        stale_nodes: Callable[[], int] = lambda: 0,
    ) -> None:
        """Gauges computed when scraped, so they are right even while nothing else happens."""
        self.metrics_age.set_function(metrics_age)
        self.metrics_ready.set_function(lambda: 1.0 if ready() else 0.0)
        self.metrics_blind.set_function(lambda: 1.0 if blind() else 0.0)
        self.metrics_stale_nodes.set_function(lambda: float(stale_nodes()))
