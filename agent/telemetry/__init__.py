"""Istio's standard metrics, computed by the agent from Envoy's gRPC access log stream:
labels.py (an entry → Istio's labels), aggregator.py (series, histograms, the cardinality cap;
sans-IO), als.py (the AccessLogService server on `<workdir>/ALS`)."""
