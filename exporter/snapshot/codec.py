"""Snapshot <-> JSON, so a recording from a production host can be analysed elsewhere (pure).

`to_json(snap)` returns plain data (dicts, lists, numbers, strings); `from_json(data)` rebuilds the
Snapshot from it using the dataclasses' type hints. Mappings with int or str keys become JSON
objects (keys as strings); others (the totals' label tuples) become lists of [key, value] pairs.
`from_json` also reads the daemon's /api/snapshot page (its "counters" view by metric name is
for people and is ignored). Unknown keys are ignored and missing ones take their defaults, so a
recording survives fields being added (and old recordings' "counters" and "histograms").
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from types import MappingProxyType
from typing import Any, TypeVar

from exporter.snapshot import Snapshot

FORMAT = "boundwatch-record"
VERSION = 1
T = TypeVar("T")


def encode(value: Any) -> Any:
    """Return a dataclass, mapping, tuple or scalar as JSON-ready data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        if all(isinstance(k, str | int) and not isinstance(k, bool) for k in value):
            return {str(k): encode(v) for k, v in value.items()}
        return [[encode(k), encode(v)] for k, v in value.items()]
    if isinstance(value, list | tuple):
        return [encode(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def to_json(snap: Snapshot, *, totals: bool = True) -> dict[str, Any]:
    """Return a Snapshot as plain data (without its integrated totals when totals is False)."""
    data = typing.cast(dict[str, Any], encode(snap))
    if not totals:
        del data["totals"]
    return data


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_named_tuple(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, tuple) and hasattr(tp, "_fields")


def decode(tp: Any, value: Any) -> Any:
    """Return data decoded into the type a dataclass field declares."""
    if value is None:
        return None
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return decode(options[0], value)
        return value  # e.g. float | str: JSON already says which
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return from_data(tp, value)
    if _is_named_tuple(tp):
        return tp(*(decode(t, v) for t, v in zip(_hints(tp).values(), value, strict=True)))
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(decode(args[0], v) for v in value)
        if args:
            return tuple(decode(a, v) for a, v in zip(args, value, strict=False))
        return tuple(value)
    if origin in (Mapping, dict, typing.Mapping) or (
        isinstance(origin, type) and issubclass(origin, Mapping)
    ):
        key_t, val_t = args if args else (Any, Any)
        pairs: Iterable[tuple[Any, Any]] = value.items() if isinstance(value, dict) else value
        return MappingProxyType({decode(key_t, k): decode(val_t, v) for k, v in pairs})
    if tp is float:
        return float(value)
    if tp is int:
        return int(value)
    if tp is str:
        return str(value)
    if tp is bool:
        return bool(value)
    return value


def _specialise(cls: type, data: Mapping[str, Any]) -> type:
    """Return the dataclass subclass whose extra fields the data carries (ThreadLoad for a ThreadCpu)."""
    own = {f.name for f in dataclasses.fields(cls)}
    subclasses: list[type] = cls.__subclasses__()
    for sub in subclasses:
        if dataclasses.is_dataclass(sub):
            extra = {f.name for f in dataclasses.fields(sub)} - own
            if extra and extra <= data.keys():
                return _specialise(sub, data)
    return cls


def from_data(cls: type[T], data: Mapping[str, Any]) -> T:
    """Return a dataclass instance from plain data (unknown keys ignored, missing ones defaulted)."""
    cls = typing.cast(type[T], _specialise(typing.cast(type, cls), data))
    hints = _hints(typing.cast(type, cls))
    kwargs = {
        f.name: decode(hints[f.name], data[f.name])
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.name in data
    }
    return cls(**kwargs)


def from_json(data: Mapping[str, Any]) -> Snapshot:
    """Return the Snapshot that `to_json` (or the daemon's /api/snapshot) wrote."""
    return from_data(Snapshot, data)


def header(**meta: Any) -> str:
    """Return the first line of a recording."""
    return json.dumps({"format": FORMAT, "version": VERSION, **meta}, sort_keys=True)


def dumps(snap: Snapshot) -> str:
    """Return one recording line for a Snapshot (totals left out: a replay integrates its own)."""
    return json.dumps(to_json(snap, totals=False), separators=(",", ":"))


def read_lines(lines: Iterable[str]) -> tuple[dict[str, Any], Iterator[Snapshot]]:
    """Return a recording's header and its Snapshots; raise ValueError if it is not a recording."""
    it = iter(lines)
    first = next(it, "")
    try:
        head = json.loads(first)
    except json.JSONDecodeError as exc:
        raise ValueError("not a boundwatch recording: the first line is not JSON") from exc
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise ValueError("not a boundwatch recording: no header line")
    if int(head.get("version", 0)) > VERSION:
        raise ValueError(f"recording version {head.get('version')} is newer than this boundwatch ({VERSION})")

    def snaps() -> Iterator[Snapshot]:
        for n, line in enumerate(it, start=2):
            if not line.strip():
                continue
            try:
                yield from_json(json.loads(line))
            except (json.JSONDecodeError, TypeError, ValueError) as exc:
                raise ValueError(f"line {n}: {exc}") from exc

    return head, snaps()
