"""Istio's standard metrics, computed by the agent from what Envoy's generated loggers write:
records.py (HTTP records from the metrics FIFO → observations; sans-IO), fifo.py (the FIFO
`<workdir>/METRICS`, read on the loop), als.py (the AccessLogService server on
`<workdir>/ALS`: TCP entries, and HTTP entries of a config without the FIFO), wire.py (ALS
entries read as far as the metrics need), labels.py (an entry → Istio's labels),
aggregator.py (series, histograms, the cardinality cap; sans-IO)."""
