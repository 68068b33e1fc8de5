"""Query parameters of `/ui/api/*` (sans-IO): each endpoint names the parameters it takes;
anything else, a parameter given twice or a value out of range is a `ParamError` (the
handler answers 400 with it as JSON), so a script's typo is an error, not a silently
different answer."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from control.duration import parse_duration

MIN_WINDOW = 1.0
MAX_WINDOW = 3600.0
DEFAULT_WINDOW = 5.0


class ParamError(ValueError):
    """A bad query: one line naming the parameter."""


@dataclass(frozen=True, slots=True)
class Param:
    parse: Callable[[str], object]
    required: bool = False
    default: object = None


def window(text: str) -> float:
    """A window: `5s`, `1m`, `300`; between 1 s and 1 h."""
    try:
        seconds = parse_duration(text)
    except ValueError as e:
        raise ParamError(str(e)) from None
    if not MIN_WINDOW <= seconds <= MAX_WINDOW:
        raise ParamError(f"{text!r} is outside 1s..1h")
    return seconds


def names(text: str) -> frozenset[str]:
    """Comma-separated names (namespaces, kinds); empty entries dropped."""
    return frozenset(n.strip() for n in text.split(",") if n.strip())


def text(value: str) -> str:
    if not value:
        raise ParamError("must not be empty")
    if len(value) > 1024:
        raise ParamError("is longer than 1024 characters")
    return value


def parse_query(items: Iterable[tuple[str, str]], spec: Mapping[str, Param]) -> dict[str, object]:
    """The parsed parameters (defaults filled in) or ParamError."""
    seen: dict[str, str] = {}
    for key, value in items:
        if key not in spec:
            allowed = ", ".join(sorted(spec)) or "none"
            raise ParamError(f"unknown parameter {key!r} (allowed: {allowed})")
        if key in seen:
            raise ParamError(f"parameter {key!r} given more than once")
        seen[key] = value
    out: dict[str, object] = {}
    for key, param in spec.items():
        if key not in seen:
            if param.required:
                raise ParamError(f"parameter {key!r} is required")
            out[key] = param.default
            continue
        try:
            out[key] = param.parse(seen[key])
        except ParamError as e:
            raise ParamError(f"parameter {key!r}: {e}") from None
    return out


GRAPH = {"window": Param(window, default=DEFAULT_WINDOW), "namespace": Param(names)}
PROXIES = {"namespace": Param(names)}
CONFIG = {"namespace": Param(names), "kind": Param(names)}
DETAIL = {"id": Param(text, required=True), "window": Param(window, default=DEFAULT_WINDOW)}
