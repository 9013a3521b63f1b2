"""What the step-time benchmark prints: JSON lines of configurations and same-run ratio lines.

* a configuration's record starts with :func:`config_header` (or is an
  :func:`error_record`); timings and counters are appended by the runner;
* :func:`ratio_lines`: ``step_ms/sgd`` (slowdown against non-private SGD),
  ``dpsgd/algorithm`` (speed-up over dense DP-SGD) and ``vocab_max/vocab_min``
  (flatness in the vocabulary), from the Keras-path records;
* :func:`backend_ratio_lines`: ``tpu_emulator/keras`` per configuration.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, Iterable, Iterator, Optional, Sequence, TextIO, Union

import numpy as np

from tfdp_sparse import mechanisms
from tfdp_sparse.layers.tpu import EmbeddingBackend


def config_header(
    algorithm: str, vocab_or_scale: Union[int, float], settings: dict, backend: EmbeddingBackend
) -> dict:
    """The first fields of a configuration's record (micro: ``vocab``, ``dim``; pctr: ``vocab_scale``, ``dim``)."""
    record: dict = {"algorithm": algorithm, "model": settings["model"], "batch": settings["batch"],
                    "embedding_backend": backend.value}
    if settings["model"] == "micro":
        record.update(vocab=int(vocab_or_scale), dim=settings["dim"])
    else:
        record.update(vocab_scale=float(vocab_or_scale), dim="int(2*V^0.25)")
    return record


def error_record(
    algorithm: str, vocab_or_scale: Union[int, float], settings: dict, backend: EmbeddingBackend, exc: Exception
) -> dict:
    """The line of a configuration that failed to build or run (``error``: type and message, capped)."""
    record = {"algorithm": algorithm, "model": settings["model"], "batch": settings["batch"],
              "embedding_backend": backend.value}
    if settings["model"] == "micro":
        record.update(vocab=int(vocab_or_scale), dim=settings["dim"])
    else:
        record["vocab_scale"] = float(vocab_or_scale)
    record["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    return record


def _jsonable(value: Any) -> Any:
    """``value`` with numpy / tuple leaves turned into JSON types (str as a last resort)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if len(value) > 8 and len(set(map(repr, value))) == 1:
            return {"all": _jsonable(value[0]), "count": len(value)}
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist() if value.size <= 32 else f"array{value.shape}"
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _slowdowns(by: dict, algorithms: list, vocabs: list) -> list[dict]:
    """``step_ms/sgd``: each algorithm's step time over non-private SGD's, per vocabulary."""
    floor = mechanisms.NONPRIVATE  # the registry's reference
    out = []
    for algo in algorithms:
        if algo == floor:
            continue
        for v in vocabs:
            if (algo, v) in by and (floor, v) in by and by[(floor, v)] > 0:
                out.append({"ratio": f"step_ms/{floor}", "algorithm": algo, "vocab": v,
                            "value": round(by[(algo, v)] / by[(floor, v)], 3)})
    return out


def _speedups(by: dict, algorithms: list, vocabs: list) -> list[dict]:
    """``dpsgd/algorithm``: dense DP-SGD's step time over each algorithm's, per vocabulary."""
    dense = mechanisms.DENSE_REFERENCE  # the registry's reference
    out = []
    for algo in algorithms:
        if algo == dense:
            continue
        for v in vocabs:
            if (algo, v) in by and (dense, v) in by and by[(algo, v)] > 0:
                out.append({"ratio": f"{dense}/algorithm", "algorithm": algo, "vocab": v,
                            "value": round(by[(dense, v)] / by[(algo, v)], 3)})
    return out


def _flatness(by: dict, algorithms: list, vocabs: list) -> list[dict]:
    """``vocab_max/vocab_min``: each algorithm's step time at its largest over its smallest vocabulary."""
    out = []
    for algo in algorithms:
        mine = sorted(v for v in vocabs if (algo, v) in by)
        if len(mine) >= 2 and by[(algo, mine[0])] > 0:
            out.append({
                "ratio": "vocab_max/vocab_min",
                "algorithm": algo,
                "vocab_max": mine[-1],
                "vocab_min": mine[0],
                "value": round(by[(algo, mine[-1])] / by[(algo, mine[0])], 3),
            })
    return out


def ratio_lines(records: Iterable[dict]) -> list[dict]:
    """Ratios between configurations of the same run (see the module docstring)."""
    ok = [r for r in records if "step_ms" in r]
    by = {(r["algorithm"], r["vocab"]): r["step_ms"] for r in ok}
    algorithms = list(dict.fromkeys(r["algorithm"] for r in ok))
    vocabs = list(dict.fromkeys(r["vocab"] for r in ok))
    return _slowdowns(by, algorithms, vocabs) + _speedups(by, algorithms, vocabs) + _flatness(by, algorithms, vocabs)


def backend_ratio_lines(records: Iterable[dict]) -> list[dict]:
    """``{"ratio": "tpu_emulator/keras", ...}``: the TPU program's step time over the Keras path's, same config."""
    ok = [r for r in records if "step_ms" in r]
    keras = {(r["algorithm"], r["vocab"]): r["step_ms"] for r in ok if r.get("embedding_backend") == "keras"}
    out = []
    for r in ok:
        backend = r.get("embedding_backend")
        key = (r["algorithm"], r["vocab"])
        if backend not in (None, "keras") and keras.get(key, 0) > 0:
            out.append({"ratio": f"{backend}/keras", "algorithm": key[0], "vocab": key[1],
                        "value": round(r["step_ms"] / keras[key], 3)})
    return out


def run_ratio_lines(records: Sequence[dict], model_name: str) -> list[dict]:
    """The ratio lines closing a run: Keras-path ratios, then backend ratios, each tagged with ``model``."""
    keras = [r for r in records if r.get("embedding_backend", EmbeddingBackend.KERAS.value) == "keras"]
    ratios = ratio_lines(keras) + backend_ratio_lines(records)
    for ratio in ratios:
        ratio["model"] = model_name
    return ratios


def _emit(record: dict, sinks: Sequence[TextIO]) -> None:
    """Writes ``record`` as one JSON line to every sink, flushed."""
    line = json.dumps(record, sort_keys=False)
    for sink in sinks:
        sink.write(line + "\n")
        sink.flush()


@contextlib.contextmanager
def open_sinks(out: TextIO, output: Optional[str]) -> Iterator[list[TextIO]]:
    """``[out]``, plus the file ``output`` opened for appending (closed on exit) when given."""
    file = open(output, "a") if output else None
    try:
        yield [out] + ([file] if file is not None else [])
    finally:
        if file is not None:
            file.close()
