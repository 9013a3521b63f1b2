"""A per-process memo of accountant results: the same event at the same δ is computed once.

A PLD ε costs 1–2 s and a σ calibration 8–10 s, and a process asks for the
same ones again and again: DP-SGD and LazyDP calibrate to the same σ, a
ledger re-reads ε after each epoch, a budget search revisits step counts,
and a test suite builds the same plan in many tests. The accountant is a pure
function of the event, δ and its settings, so its answers are memoised here
under an *exact* key:

* `event_key` walks the event's attrs fields recursively and keeps each
  value with its type (``np.float32(1.1)`` and ``1.1`` are different keys,
  ``GaussianDpEvent(1.0)`` and ``LaplaceDpEvent(1.0)`` too); an object that
  is not an attrs event of plain values has no key and is never memoised.
* Only successful computations are stored; an error is raised again each
  time, and a logged fallback (PLD failing over to RDP) is logged each time.

Example::

    >>> import dp_accounting
    >>> memo = Memo(maxsize=2)
    >>> ev = dp_accounting.GaussianDpEvent(1.0)
    >>> memo.get_or_compute(("rdp", event_key(ev), 1e-5), lambda: 4.0)
    4.0
    >>> memo.get_or_compute(("rdp", event_key(ev), 1e-5), lambda: 5.0)  # memoised
    4.0
    >>> event_key(dp_accounting.LaplaceDpEvent(1.0)) == event_key(ev)
    False
"""
from __future__ import annotations

import collections
import numbers
from typing import Callable, Hashable, Optional, TypeVar

import attr

T = TypeVar("T")

_PLAIN = (bool, int, float, str, type(None), numbers.Number)


def event_key(event: object) -> Optional[tuple]:
    """An exact, hashable description of a DpEvent, or None when it has none.

    Two events get the same key only when they have the same classes and
    field values (compared with their types), recursively.
    """
    try:
        return _key(event)
    except _NoKey:
        return None


def exact_key(*parts: object) -> Optional[tuple]:
    """One exact key of several parts (names, events, δ, settings), or None when a part has none.

    >>> exact_key("pld", 1e-5, 1e-3) == exact_key("pld", 1e-5, 1e-3), exact_key("x", object())
    (True, None)
    """
    try:
        return tuple(_key(p) for p in parts)
    except _NoKey:
        return None


class _NoKey(Exception):
    pass


def _key(value: object) -> Hashable:
    cls = type(value)
    if attr.has(cls):
        return (cls.__module__, cls.__qualname__,
                tuple(_key(getattr(value, f.name)) for f in attr.fields(cls)))
    if isinstance(value, (list, tuple)):
        return (cls.__name__, tuple(_key(v) for v in value))
    if isinstance(value, _PLAIN):
        try:
            hash(value)
        except TypeError:
            raise _NoKey() from None
        return (cls.__module__, cls.__qualname__, value)
    raise _NoKey()


class Memo:
    """A bounded map from exact keys to computed results (oldest dropped first)."""

    def __init__(self, maxsize: int = 4096) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize={maxsize!r} is invalid: it must be >= 1")
        self._maxsize = maxsize
        self._values: collections.OrderedDict = collections.OrderedDict()

    def get_or_compute(self, key: Optional[Hashable], compute: Callable[[], T]) -> T:
        """`compute()` once per key; a None key (no exact description) is never stored."""
        if key is None:
            return compute()
        if key in self._values:
            self._values.move_to_end(key)
            return self._values[key]
        value = compute()
        self._values[key] = value
        if len(self._values) > self._maxsize:
            self._values.popitem(last=False)
        return value

    def clear(self) -> None:
        """Forget every stored result."""
        self._values.clear()

    def __len__(self) -> int:
        return len(self._values)


# The process's accountant results (ε by event, σ by run-event family).
ACCOUNTANT_MEMO = Memo()
