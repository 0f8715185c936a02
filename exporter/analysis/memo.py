"""What analysis worked out from objects, found again by the objects' identities (pure, bounded)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class ByIdentity(Generic[V]):
    """A value worked out from some objects (and a key), kept with them and found again by their identities.

    For objects a tick reads again unchanged (an agent reading in every GPU's window, an engine page
    carried between slow reads, the parts of a Snapshot its later copies share). The objects are
    held with their value, so their ids are not reused while it is here; past `size` values the
    oldest goes.
    """

    __slots__ = ("_kept", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._kept: dict[tuple[Hashable, ...], tuple[tuple[object, ...], V]] = {}

    def get(self, objs: tuple[object, ...], make: Callable[[], V], key: Hashable = None) -> V:
        """Return what `make` gave for these objects and key, calling it where nothing is kept for them."""
        ident = (*map(id, objs), key)
        hit = self._kept.get(ident)
        if hit is not None:
            return hit[1]
        value = make()
        while len(self._kept) >= self.size:
            self._kept.pop(next(iter(self._kept)))
        self._kept[ident] = (objs, value)
        return value

    def clear(self) -> None:
        """Forget every value."""
        self._kept.clear()
