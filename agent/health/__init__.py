"""The workload's readiness probe (WorkloadGroup `probe`): schedule and thresholds (sans-IO,
prober.py), the checks themselves (checks.py), and the component that runs them and reports
health to the control plane (checker.py)."""

# The app's original probes as the injector hands them over (appprobers.py parses them). Here,
# in the package, so that agent/config.py can look for it without importing the parser.
APP_PROBERS_ENV = "ISTIO_KUBE_APP_PROBERS"
