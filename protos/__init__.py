"""Pilotfish wire definitions: our .proto sources, their generated code, and xDS helpers."""
