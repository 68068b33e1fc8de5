"""The workload's readiness probe (WorkloadGroup `probe`): schedule and thresholds (sans-IO,
prober.py), the checks themselves (checks.py), and the component that runs them and reports
health to the control plane (checker.py)."""
