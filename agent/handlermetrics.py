"""Per-handler ResponseHandler metrics, registered on the agent's metrics registry (so they
are on `/stats/prometheus` with the rest), fed by HandlerRegistry (see
agent.xdsproxy.handlers.HandlerObserver). Labels: `handler` (the plug-in's entry-point name,
or the handler's qualified name for the agent's own) and `type` (the message name, as the
agent's other xDS metrics spell it): both bounded by what was registered at start."""

from __future__ import annotations

from agent.metrics import AgentMetrics, Counter, Histogram, short_type

# Handlers run per response (a push), not per request: milliseconds to seconds.
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class HandlerMetricsObserver:
    def __init__(self, metrics: AgentMetrics) -> None:
        r = metrics.registry
        labels = ["handler", "type"]
        self.responses = Counter(
            "pilotfish_agent_handler_responses",
            "Responses a ResponseHandler was called with (consumed or observed).",
            labels,
            registry=r,
        )
        self.rejections = Counter(
            "pilotfish_agent_handler_rejections",
            "Responses a consuming ResponseHandler rejected (the agent NACKed them).",
            labels,
            registry=r,
        )
        self.errors = Counter(
            "pilotfish_agent_handler_observe_errors",
            "Responses an observing ResponseHandler failed on (logged; never a NACK).",
            labels,
            registry=r,
        )
        self.dropped = Counter(
            "pilotfish_agent_handler_observe_dropped",
            "Relayed responses not shown to an observer because its queue was full.",
            labels,
            registry=r,
        )
        self.duration = Histogram(
            "pilotfish_agent_handler_duration_seconds",
            "Time to decode a response and run its ResponseHandler.",
            labels,
            buckets=_BUCKETS,
            registry=r,
        )

    def handled(self, handler: str, type_url: str, seconds: float) -> None:
        t = short_type(type_url)
        self.responses.labels(handler, t).inc()
        self.duration.labels(handler, t).observe(seconds)

    def rejected(self, handler: str, type_url: str) -> None:
        self.rejections.labels(handler, short_type(type_url)).inc()

    def observe_error(self, handler: str, type_url: str) -> None:
        self.errors.labels(handler, short_type(type_url)).inc()

    def observe_dropped(self, handler: str, type_url: str) -> None:
        self.dropped.labels(handler, short_type(type_url)).inc()
