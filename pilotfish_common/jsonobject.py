"""A JSON object from text, or a ValueError saying what the text is instead: for the agent's
flags and environment that carry JSON, and the key worker's frames."""

from __future__ import annotations

from typing import Any


def json_object(text: str | bytes, what: str = "a JSON object") -> dict[str, Any]:
    """`text` parsed; ValueError "not valid JSON: ..." or "expected <what>" otherwise."""
    import json  # here: most starts parse no JSON flag, and json's import is ~1 ms

    try:
        data = json.loads(text)
    except ValueError as e:
        raise ValueError(f"not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"expected {what}")
    return data
