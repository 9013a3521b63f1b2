"""JSON (de)serialisation of `dp_accounting` DpEvents, with a whitelist of types.

The privacy ledger travels inside checkpoints and metrics files, so its events
must round-trip exactly (ints stay ints, floats stay floats) and loading must
never construct an arbitrary class: only the DpEvent types of `dp_accounting`
listed in `_EVENT_SCHEMA` are accepted (the event algebra of the
dp_accounting library, Google DP team 2022; DP-SGD's event is Abadi et al.
2016's Poisson-subsampled Gaussian).

Example::

    >>> d = event_to_dict(dp_accounting.SelfComposedDpEvent(
    ...     dp_accounting.GaussianDpEvent(2), 10))
    >>> d
    {'type': 'SelfComposedDpEvent', 'event': {'type': 'GaussianDpEvent', 'noise_multiplier': 2}, 'count': 10}
    >>> event_from_dict(d)
    SelfComposedDpEvent(event=GaussianDpEvent(noise_multiplier=2), count=10)
"""
from __future__ import annotations

import numbers
from typing import Any

import dp_accounting
from dp_accounting import dp_event as _dp_event

from tfdp_sparse.accounting.validation import _is_real

# type name -> (class, {field: kind}); kinds: float, int, event, events, ints.
_EVENT_SCHEMA: dict[str, tuple[type, dict[str, str]]] = {
    "NoOpDpEvent": (_dp_event.NoOpDpEvent, {}),
    "NonPrivateDpEvent": (_dp_event.NonPrivateDpEvent, {}),
    "UnsupportedDpEvent": (_dp_event.UnsupportedDpEvent, {}),
    "GaussianDpEvent": (_dp_event.GaussianDpEvent,
                        {"noise_multiplier": "float"}),
    "LaplaceDpEvent": (_dp_event.LaplaceDpEvent, {"noise_multiplier": "float"}),
    "SelfComposedDpEvent": (_dp_event.SelfComposedDpEvent,
                            {"event": "event", "count": "int"}),
    "ComposedDpEvent": (_dp_event.ComposedDpEvent, {"events": "events"}),
    "PoissonSampledDpEvent": (_dp_event.PoissonSampledDpEvent,
                              {"sampling_probability": "float",
                               "event": "event"}),
    "SampledWithReplacementDpEvent": (
        _dp_event.SampledWithReplacementDpEvent,
        {"source_dataset_size": "int", "sample_size": "int", "event": "event"}),
    "SampledWithoutReplacementDpEvent": (
        _dp_event.SampledWithoutReplacementDpEvent,
        {"source_dataset_size": "int", "sample_size": "int", "event": "event"}),
    "SingleEpochTreeAggregationDpEvent": (
        _dp_event.SingleEpochTreeAggregationDpEvent,
        {"noise_multiplier": "float", "step_counts": "ints"}),
    "RepeatAndSelectDpEvent": (_dp_event.RepeatAndSelectDpEvent,
                               {"event": "event", "mean": "float",
                                "shape": "float"}),
}
_CLASS_TO_NAME = {cls: name for name, (cls, _) in _EVENT_SCHEMA.items()}


def _number_to_json(value: Any, kind: str, where: str) -> Any:
    if kind == "int":
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise ValueError(f"{where}={value!r}: expected an integer")
        return int(value)
    if not _is_real(value):
        raise ValueError(f"{where}={value!r}: expected a number")
    # Keep ints as ints so the round trip is exact in type as well as value.
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def event_to_dict(event: dp_accounting.DpEvent) -> dict[str, Any]:
    """A JSON-ready dict for a DpEvent; exact inverse of `event_from_dict`.

    >>> event_to_dict(dp_accounting.PoissonSampledDpEvent(  # doctest: +NORMALIZE_WHITESPACE
    ...     0.01, dp_accounting.GaussianDpEvent(1.1)))
    {'type': 'PoissonSampledDpEvent', 'sampling_probability': 0.01,
     'event': {'type': 'GaussianDpEvent', 'noise_multiplier': 1.1}}
    """
    name = _CLASS_TO_NAME.get(type(event))
    if name is None:
        raise ValueError(
            f"cannot serialise event of type {type(event).__name__!r}: known "
            f"types are {sorted(_EVENT_SCHEMA)}")
    out: dict[str, Any] = {"type": name}
    for field, kind in _EVENT_SCHEMA[name][1].items():
        value = getattr(event, field)
        where = f"{name}.{field}"
        if kind == "event":
            out[field] = event_to_dict(value)
        elif kind == "events":
            out[field] = [event_to_dict(e) for e in value]
        elif kind == "ints" and not isinstance(value, numbers.Integral):
            out[field] = [_number_to_json(v, "int", where) for v in value]
        else:
            out[field] = _number_to_json(value, "int" if kind == "ints"
                                         else kind, where)
    return out


def event_from_dict(data: Any) -> dp_accounting.DpEvent:
    """Rebuilds a DpEvent from `event_to_dict` output (whitelisted types only).

    >>> event_from_dict({"type": "GaussianDpEvent", "noise_multiplier": 1.1})
    GaussianDpEvent(noise_multiplier=1.1)
    """
    if not isinstance(data, dict) or "type" not in data:
        raise ValueError(f"not a serialised DpEvent (no 'type' key): {data!r}")
    name = data["type"]
    if name not in _EVENT_SCHEMA:
        raise ValueError(
            f"unknown DpEvent type {name!r} in serialised ledger: known types "
            f"are {sorted(_EVENT_SCHEMA)}")
    cls, fields = _EVENT_SCHEMA[name]
    extra = set(data) - set(fields) - {"type"}
    missing = set(fields) - set(data)
    if extra or missing:
        raise ValueError(
            f"serialised {name} has unexpected fields {sorted(extra)} / "
            f"missing fields {sorted(missing)}")
    kwargs: dict[str, Any] = {}
    for field, kind in fields.items():
        value = data[field]
        where = f"{name}.{field}"
        if kind == "event":
            kwargs[field] = event_from_dict(value)
        elif kind == "events":
            if not isinstance(value, list):
                raise ValueError(f"{where}: expected a list of events")
            kwargs[field] = [event_from_dict(e) for e in value]
        elif kind == "ints" and isinstance(value, list):
            kwargs[field] = [_number_to_json(v, "int", where) for v in value]
        else:
            kwargs[field] = _number_to_json(value, "int" if kind == "ints"
                                            else kind, where)
    return cls(**kwargs)
