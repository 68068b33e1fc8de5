"""Workload certificates for Envoy: keys, CSRs, rotation, the CA client and the SDS server."""
