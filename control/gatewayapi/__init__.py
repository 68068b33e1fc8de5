"""The Kubernetes Gateway API: translation into the model and status (sans-IO)."""
