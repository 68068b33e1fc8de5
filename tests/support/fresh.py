"""Running a snippet in a new interpreter, where nothing is imported yet: what a module
imports is then countable (regression tests of the agent's start, measured in modules, not
in milliseconds)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def fresh_lines(code: str) -> list[str]:
    """The lines `code` prints, run by a fresh `python -c` in the repository's root."""
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return out.stdout.split("\n")
