"""What analysis worked out from one object, found again by the object's identity (pure, bounded)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")
V = TypeVar("V")


class ByIdentity(Generic[T, V]):
    """A value worked out from an object (and a key), kept with the object and found again by its identity.

    For objects a tick reads again unchanged (an agent reading in every GPU's window, an engine page
    carried between slow reads). The object is held with its value, so its id is not reused while it
    is here; past `size` objects the oldest goes.
    """

    __slots__ = ("_kept", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._kept: dict[int, tuple[T, Hashable, V]] = {}

    def get(self, obj: T, make: Callable[[], V], key: Hashable = None) -> V:
        """Return what `make` gave for this object and key, calling it where nothing is kept for them."""
        hit = self._kept.get(id(obj))
        if hit is not None and hit[0] is obj and hit[1] == key:
            return hit[2]
        value = make()
        while len(self._kept) >= self.size:
            self._kept.pop(next(iter(self._kept)))
        self._kept[id(obj)] = (obj, key, value)
        return value

    def clear(self) -> None:
        """Forget every object."""
        self._kept.clear()
