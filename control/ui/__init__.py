"""The mesh dashboard at `/ui/` (DESIGN "Dashboard"): the service graph from Istio's standard
metrics, the proxies' sync state and the loaded config, as JSON under `/ui/api/*` and one page
that draws them. Deciding modules are sans-IO (promtext, history, graph, params, views,
details, layout of the JSON); scrape.py, promapi.py and routes.py are the thin I/O around them.
"""
