"""Typed, path-aware access to the fields of one config object.

A `Fields` view wraps one mapping of a raw object. Each accessor checks the type of the value
and raises a ConfigError that names the object, the field path and the line:

    backend.yaml:12: Service default/backend: spec.ports[0].port: must be an integer 1-65535

Views remember which keys were read; `finish()` turns every key nobody read into a warning
(`spec.foo is not supported; ignored`), so unsupported fields are never silently dropped.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from control.config import formats
from control.config.errors import ConfigError
from control.config.manifest import RawObject, format_path
from control.config.yamlsource import Path
from control.model.types import ConfigWarning, SourceRef

PORT_RANGE = "must be an integer 1-65535"
DURATION_FORM = "must be a duration like 10s, 1.5s, 250ms or 1m30s"

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns)")
_DURATION_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def parse_go_duration(text: str) -> float | None:
    """Seconds in a protobuf/Go duration string (`10s`, `0.5s`, `250ms`, `1m30s`); None when
    the text is not one."""
    pos, total = 0, 0.0
    for m in _DURATION_PART.finditer(text):
        if m.start() != pos:
            return None
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        return None
    return total


class Context:
    """Errors and warnings for one object."""

    def __init__(self, obj: RawObject) -> None:
        self.obj = obj
        self.source: SourceRef = obj.source
        self.warnings: list[ConfigWarning] = []

    def error(self, path: Path, reason: str) -> ConfigError:
        where = f"{format_path(path)}: " if path else ""
        return ConfigError(
            self.obj.file, self.obj.line_of(path), f"{self.obj.label}: {where}{reason}"
        )

    def fail(self, path: Path, reason: str) -> NoReturn:
        raise self.error(path, reason)

    def warn(self, message: str) -> None:
        warning = ConfigWarning(self.source, message)
        if warning not in self.warnings:
            self.warnings.append(warning)

    def warn_unsupported(self, path: Path, detail: str = "") -> None:
        what = format_path(path) + (f" {detail}" if detail else "")
        self.warn(f"{what} is not supported; ignored")

    def root(self) -> Fields:
        return Fields(self, (), dict(self.obj.data))


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


class Fields:
    """Read access to one mapping of an object, with type checks and use tracking."""

    def __init__(self, ctx: Context, path: Path, data: dict[str, Any]) -> None:
        self.ctx = ctx
        self.path = path
        self.data = data
        self._used: set[str] = set()

    # --- generic ---------------------------------------------------------------------------

    def at(self, key: str | int) -> Path:
        return (*self.path, key)

    def fail(self, key: str | int | None, reason: str) -> NoReturn:
        self.ctx.fail(self.path if key is None else self.at(key), reason)

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def keys(self) -> list[str]:
        return list(self.data)

    def raw(self, key: str) -> Any:
        """The value of `key` (None when absent or null), marking the key as handled."""
        self._used.add(key)
        return self.data.get(key)

    def ignore(self, *keys: str) -> None:
        """Mark keys as handled without reading them (fields with no effect here)."""
        self._used.update(keys)

    def unused(self) -> list[str]:
        """The keys nobody has handled yet (what `finish()` would warn about)."""
        return [key for key in self.data if key not in self._used]

    def finish(self) -> None:
        """Warn about every key that was not handled."""
        for key in self.data:
            if key not in self._used:
                self.ctx.warn_unsupported(self.at(key))

    def _missing(self, key: str) -> NoReturn:
        self.fail(key, "is required")

    # --- scalars ---------------------------------------------------------------------------

    def get_str(self, key: str, *, required: bool = False, default: str = "") -> str:
        value = self.raw(key)
        if value is None or value == "":
            if required:
                self._missing(key)
            return default
        if not isinstance(value, str):
            self.fail(key, f"must be a string, got {_type_name(value)}")
        return value

    def get_enum(self, key: str, choices: tuple[str, ...], *, default: str) -> str:
        """One of `choices` (case-sensitive, as the Kubernetes and Istio APIs are)."""
        value = self.get_str(key, default=default)
        if value not in choices:
            self.fail(key, f"must be one of {', '.join(choices)} (got {value!r})")
        return value

    def get_int(
        self,
        key: str,
        *,
        required: bool = False,
        minimum: int = 0,
        maximum: int = 2**32 - 1,
        message: str = "",
    ) -> int | None:
        value = self.raw(key)
        if value is None:
            if required:
                self._missing(key)
            return None
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not (minimum <= value <= maximum)
        ):
            self.fail(key, message or f"must be an integer {minimum}-{maximum}")
        return value

    def get_port(self, key: str, *, required: bool = False) -> int | None:
        return self.get_int(key, required=required, minimum=1, maximum=65535, message=PORT_RANGE)

    def need_port(self, key: str) -> int:
        value = self.get_port(key, required=True)
        if value is None:
            self._missing(key)
        return value

    def get_duration(self, key: str, *, positive: bool = False) -> float | None:
        """A duration in seconds (`10s`, `250ms`, `1m30s`); absent -> None."""
        value = self.raw(key)
        if value is None:
            return None
        seconds = parse_go_duration(value) if isinstance(value, str) else None
        if seconds is None:
            self.fail(key, f"{DURATION_FORM} (got {value!r})")
        if positive and seconds <= 0:
            self.fail(key, "must be longer than zero")
        return seconds

    def get_percent(self, key: str) -> float | None:
        """An Istio `Percent` (`{value: 12.5}`), 0-100; absent -> None."""
        f = self.get_map(key)
        if f is None:
            return None
        value = f.raw("value")
        if value is None:
            value = 0.0
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 100:
            f.fail("value", "must be a number 0-100")
        f.finish()
        return float(value)

    def get_bool(self, key: str, *, default: bool = False) -> bool:
        value = self.raw(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.fail(key, f"must be true or false, got {_type_name(value)}")
        return value

    # --- collections -----------------------------------------------------------------------

    def get_map(self, key: str, *, required: bool = False) -> Fields | None:
        value = self.raw(key)
        if value is None:
            if required:
                self._missing(key)
            return None
        if not isinstance(value, dict):
            self.fail(key, f"must be a mapping, got {_type_name(value)}")
        return Fields(self.ctx, self.at(key), value)

    def need_map(self, key: str) -> Fields:
        value = self.get_map(key, required=True)
        if value is None:
            self._missing(key)
        return value

    def get_list(self, key: str, *, required: bool = False) -> list[tuple[Path, Any]]:
        """The items of a list field with their paths; absent -> []."""
        value = self.raw(key)
        if value is None or value == []:
            if required:
                self.fail(key, "is required (a non-empty list)")
            return []
        if not isinstance(value, list):
            self.fail(key, f"must be a list, got {_type_name(value)}")
        return [((*self.at(key), i), item) for i, item in enumerate(value)]

    def get_maps(self, key: str, *, required: bool = False) -> list[Fields]:
        """A list of mappings (`ports`, `ingress`, ...)."""
        out: list[Fields] = []
        for path, item in self.get_list(key, required=required):
            if not isinstance(item, dict):
                self.ctx.fail(path, f"must be a mapping, got {_type_name(item)}")
            out.append(Fields(self.ctx, path, item))
        return out

    def get_strs(self, key: str, *, required: bool = False) -> list[tuple[Path, str]]:
        """A list of non-empty strings with their paths."""
        out: list[tuple[Path, str]] = []
        for path, item in self.get_list(key, required=required):
            if not isinstance(item, str) or not item:
                self.ctx.fail(path, f"must be a non-empty string, got {_type_name(item)}")
            out.append((path, item))
        return out

    def get_items(self, key: str) -> Iterator[tuple[Path, str, Any]]:
        """(path, key, value) for each entry of a mapping field."""
        sub = self.get_map(key)
        if sub is None:
            return
        for k, v in sub.data.items():
            yield sub.at(k), k, v

    def get_labels(self, key: str) -> dict[str, str] | None:
        """A Kubernetes label map (string keys and string values, valid syntax); absent -> None."""
        if self.raw(key) is None:
            return None
        out: dict[str, str] = {}
        for path, k, v in self.get_items(key):
            if problem := formats.label_key(k):
                self.ctx.fail(path, problem)
            if not isinstance(v, str):
                shown = str(v).lower() if isinstance(v, bool) else str(v)
                hint = f' (quote it: "{shown}")' if isinstance(v, int | float) else ""
                self.ctx.fail(path, f"label values must be strings, got {_type_name(v)}{hint}")
            if problem := formats.label_value(v):
                self.ctx.fail(path, problem)
            out[k] = v
        return out

    def get_port_map(
        self, key: str, check_name: Callable[[str], str | None] | None = None
    ) -> dict[str, int]:
        """A map of port name -> port number (WorkloadEntry / endpoint `ports`)."""
        out: dict[str, int] = {}
        for path, k, v in self.get_items(key):
            if check_name is not None and (problem := check_name(k)):
                self.ctx.fail(path, f"port name {k!r} {problem}")
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 65535:
                self.ctx.fail(path, PORT_RANGE)
            out[k] = v
        return out
