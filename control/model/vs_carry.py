"""Which VirtualServices of a new snapshot are the previous snapshot's, and which replace one
of them in place.

Config sources make new objects for whatever they parse again: the file watcher for a changed
file, the Gateway API translation for the routes that changed, and for every route when a
Gateway, ReferenceGrant, Service or another input all routes read changed
(control/gatewayapi/translate.py). Everything a push carries over is keyed by a VirtualService's
identity (its bindings to gateway servers, its route translation, the bytes of the virtual
hosts it serves), so `carry_over` gives the new snapshot the previous snapshot's object for
every VirtualService equal to it, and says which ones replace another of the same name at the
same position (`Replaced`): a derived index patches the previous index's order and bindings
with those instead of sorting and binding every VirtualService again.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import compress
from operator import is_not

from control.model.traffic import VirtualService


@dataclass(frozen=True, slots=True)
class Replaced:
    """VirtualServices that differ from the previous snapshot's at the same position of
    `MeshConfig.virtual_services`, each with the same namespace and name: the objects before
    and now, pairwise. Everything else in the tuple is the previous snapshot's object."""

    before: tuple[VirtualService, ...] = ()
    now: tuple[VirtualService, ...] = ()


def carry_over(
    old: tuple[VirtualService, ...], new: tuple[VirtualService, ...]
) -> tuple[tuple[VirtualService, ...], Replaced | None]:
    """`new` with every VirtualService that equals `old`'s of its namespace and name replaced
    by `old`'s object (`old` itself when that leaves nothing else), and what replaces what in
    place (None when VirtualServices were added, removed or moved)."""
    if new is old:
        return old, Replaced()
    if len(new) != len(old):
        return _by_key(old, new), None
    out: list[VirtualService] | None = None
    before: list[VirtualService] = []
    now: list[VirtualService] = []
    # Identity first: a source that kept its objects makes this a scan at C speed.
    for i in compress(range(len(new)), map(is_not, old, new)):
        was, vs = old[i], new[i]
        if was.key != vs.key:
            return _by_key(old, new), None
        if was == vs:
            if out is None:
                out = list(new)
            out[i] = was
        else:
            before.append(was)
            now.append(vs)
    if not now:
        return old, Replaced()
    return (tuple(out) if out is not None else new), Replaced(tuple(before), tuple(now))


def _by_key(
    old: tuple[VirtualService, ...], new: tuple[VirtualService, ...]
) -> tuple[VirtualService, ...]:
    by_key = {vs.key: vs for vs in old}
    return tuple(
        was if (was := by_key.get(vs.key)) is not None and (was is vs or was == vs) else vs
        for vs in new
    )
