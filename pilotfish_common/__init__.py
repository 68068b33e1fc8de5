"""Helpers the agent and the control plane share; neither may import the other's package.

Kept free of third-party imports: the agent's start time counts every module it loads.
"""
