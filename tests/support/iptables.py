"""Reading `iptables-save` dumps back, for tests that compare the capture rules before and
after the agent installs or removes them."""

from __future__ import annotations

from agent.capture.rules import nat_table


def nat_lines(text: str) -> list[str]:
    """The nat table's declaration and rule lines of an `iptables-save` dump, counters
    zeroed (they change with traffic, the rules do not)."""
    out: list[str] = []
    for line in nat_table(text):
        if not line or line.startswith("#") or line == "COMMIT":
            continue
        if line.startswith(":"):
            name, policy = line[1:].split()[:2]
            line = f":{name} {policy} [0:0]"
        out.append(line)
    return out
