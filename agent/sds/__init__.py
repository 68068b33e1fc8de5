"""The agent's SDS: workload key and CSR, certificate rotation, the secret cache and the SDS
server Envoy reads `default` and `ROOTCA` from (DESIGN "Security model")."""
