"""`replace` for the Snapshot's frozen dataclasses: `dataclasses.replace` without running __init__ again.

A tick copies Snapshots and engine readings (49 fields) a dozen times with a field or two changed;
`dataclasses.replace` runs the frozen __init__, one `object.__setattr__` per field (~10 us for an
EngineReading). For a dataclass whose __init__ only sets its fields, the copy's __dict__ is filled
in field order, as __init__ would fill it: the same object, equal, with the same repr, still frozen.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")

# class -> its field names when a copy may be made by __dict__ (else None: dataclasses.replace)
_PLAIN: dict[type, tuple[tuple[str, ...], frozenset[str]] | None] = {}


def _plain(cls: type) -> tuple[tuple[str, ...], frozenset[str]] | None:
    """Return a dataclass's field names when its __init__ only sets them, each as given (else None)."""
    if cls in _PLAIN:
        return _PLAIN[cls]
    found: tuple[tuple[str, ...], frozenset[str]] | None = None
    params = getattr(cls, "__dataclass_params__", None)
    if (
        params is not None
        and params.init
        and "__slots__" not in cls.__dict__
        and not hasattr(cls, "__post_init__")
        and all(
            f.init and f._field_type is dataclasses._FIELD  # type: ignore[attr-defined]
            for f in cls.__dataclass_fields__.values()  # type: ignore[attr-defined]
        )
        and not any("__slots__" in base.__dict__ for base in cls.__mro__[1:-1])
    ):
        names = tuple(f.name for f in dataclasses.fields(cls))
        found = (names, frozenset(names))
    _PLAIN[cls] = found
    return found


def replace(obj: T, /, **changes: Any) -> T:
    """Return `dataclasses.replace(obj, **changes)`: a copy of a dataclass with some fields changed.

    Made without __init__ where __init__ only sets the fields (no __post_init__, InitVar,
    init=False field or __slots__): a cache an object keeps beside its fields in __dict__ (as
    `Snapshot.gpu`'s) is not copied, as __init__ would not copy it. Any other class, and a name
    that is no field, go to `dataclasses.replace` (and its errors).
    """
    plain = _plain(type(obj))
    if plain is None or not changes.keys() <= plain[1]:
        return dataclasses.replace(obj, **changes)  # type: ignore[type-var]
    old = obj.__dict__
    fields = {name: old[name] for name in plain[0]}
    fields.update(changes)  # each a field already: the order stays the fields'
    new = object.__new__(type(obj))
    new.__dict__.update(fields)
    return new
