"""Errors raised for bad config files.

Every problem a user can cause (unreadable file, YAML syntax, a bad field value) is reported as a
`ConfigError` that says where it is (`file:line`) and what is wrong, so the CLI can print one line
and exit, and the watcher can log one line and keep serving the last good config.
"""

from __future__ import annotations

# Characters that would break a one-line message, as escapes: C0 and C1 controls (tab kept) and
# Unicode's line and paragraph separators. A name or value quoted from a file can hold them
# (YAML folds NEL, U+0085, into a line break inside a flow scalar), and a log line or the CLI's
# one-line error must still be one line.
_ONE_LINE = {
    c: f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"
    for c in (*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029)
    if c != 0x09
}


def one_line(text: str) -> str:
    """`text` with every character that could start a new line escaped (`\\x0a`, ...)."""
    return text.translate(_ONE_LINE)


class ConfigError(Exception):
    """A config file could not be loaded: `file:line: reason` (line is 1-based)."""

    def __init__(self, file: str, line: int, reason: str) -> None:
        file, reason = one_line(file), one_line(reason)
        super().__init__(file, line, reason)
        self.file = file
        self.line = line
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ConfigError):
            return NotImplemented
        return (type(self), self.file, self.line, self.reason) == (
            type(other),
            other.file,
            other.line,
            other.reason,
        )

    def __hash__(self) -> int:
        return hash((type(self), self.file, self.line, self.reason))


class DuplicateObjectError(ConfigError):
    """Two config objects have the same kind, namespace and name.

    `file`/`line` point to the later definition (in file, line order); `first_file`/`first_line`
    to the one that came first. Both places are named in the message.
    """

    def __init__(
        self,
        file: str,
        line: int,
        reason: str,
        *,
        first_file: str,
        first_line: int,
        what: str = "",
    ) -> None:
        super().__init__(file, line, reason)
        self.first_file = first_file
        self.first_line = first_line
        self.what = what  # the object, e.g. "Service default/backend"

    def __reduce__(self) -> tuple[object, ...]:
        return (
            _make_duplicate,
            (self.file, self.line, self.reason, self.first_file, self.first_line, self.what),
        )


def _make_duplicate(
    file: str, line: int, reason: str, first_file: str, first_line: int, what: str
) -> DuplicateObjectError:
    return DuplicateObjectError(
        file, line, reason, first_file=first_file, first_line=first_line, what=what
    )
