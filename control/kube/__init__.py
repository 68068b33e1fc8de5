"""The Kubernetes config source: list+watch of the API server (client, reflector, source)."""
