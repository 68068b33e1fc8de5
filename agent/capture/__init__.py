"""Transparent traffic capture (interception mode REDIRECT): the iptables rules that steer a
pod's traffic into Envoy, built as data (`rules`) and applied with Debian's iptables
(`apply`); `cli` is the `pilotfish-agent iptables` subcommand."""
