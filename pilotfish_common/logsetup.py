"""Logging for every command: `--log-level`, `--log-format text|json`."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

# Chatty at info; kept at warning unless debugging. (The agent never loads aiohttp, so
# quieting its access log there changes nothing.)
_QUIETED = ("aiohttp.access", "grpc")


LEVELS = ("debug", "info", "warning", "error")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`--log-level` and `--log-format`, which every command takes."""
    parser.add_argument("--log-level", choices=LEVELS, default="info")
    parser.add_argument("--log-format", choices=("text", "json"), default="text")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "scope": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    if level.upper() != "DEBUG":
        for name in _QUIETED:
            logging.getLogger(name).setLevel(logging.WARNING)
