"""TPU embedding configs for the private step: tables, features, one update feature per table.

On a TPU the table optimizer runs next to the tables and sums the per-id
activation gradients of every feature (TF's ``TPUEmbedding`` mid-level API;
DESIGN §3 "TPU embedding"). The DP step of
:mod:`tfdp_sparse.layers.tpu.private_step` therefore gives the real features
no gradient and sends the mechanism's final rows (clipped sums plus noise,
false positives, LazyDP catch-up) through one extra single-id *update*
feature per table with ``K`` slots. For that to be the whole update, the
table optimizer must be plain SGD at rate 1 (the learning rate and ``1/B``
are applied on the TensorCore, so one packed row is exactly the change of
its table row), with no gradient clipping (``clipvalue`` would clip the
noised rows per coordinate after noise: a different, unaccounted mechanism),
no weight decay (it rewrites every looked-up row, revealing which were read)
and no pipelining of the embedding update with the next lookup.

:func:`build_plan` builds the ``TableConfig`` / ``FeatureConfig`` objects and
refuses, with ``ValueError``, every setting that breaks DP:

* a table optimizer with ``clipvalue``, weight decay or weight clipping;
* a non-SGD table optimizer with lazy noise (LazyDP: deferred noise equals
  DP-SGD only under plain SGD), and Adam / FTRL / momentum optimizers in
  any case (with a zero gradient they still move the looked-up rows);
* SGD at a rate other than 1 (the step packs final deltas);
* id dropping on SparseCore (a dropped id silently loses a row's update or
  noise) and ``pipeline_execution_with_tensor_core=True``.

Example::

    specs = [TableSpec("embedding_0", vocab_size=1000, dim=8, combiner=Combiner.SUM, ids_per_example=3)]
    plan = build_plan(specs, update_slots=512, batch_size=64)
    plan.feature_config()          # {"embedding_0": FeatureConfig, "embedding_0/update": FeatureConfig}
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Mapping, Optional, Sequence, Union

import tensorflow as tf

_api = tf.tpu.experimental.embedding

UPDATE_SUFFIX = "/update"
READ_SUFFIX = "/read"


class Combiner(enum.Enum):
    """How a multi-id feature pools its rows (``NONE``: one id per example)."""

    NONE = "none"
    SUM = "sum"
    MEAN = "mean"
    SQRTN = "sqrtn"

    @property
    def table_combiner(self) -> str:
        """The ``TableConfig.combiner`` string (single-id features use ``"sum"``: one row each)."""
        return "sum" if self is Combiner.NONE else self.value


@dataclasses.dataclass(frozen=True)
class TableSpec:
    """One table and its one real feature.

    Attributes:
      name: table and feature name (the ``DPEmbedding`` layer's name).
      vocab_size: rows ``V``; dim: width ``d``.
      combiner: pooling of the feature's ids.
      ids_per_example: ``L``, the most ids one example looks up (1 for single-id).
      initializer: table initializer (``None``: TF's default).
    """

    name: str
    vocab_size: int
    dim: int
    combiner: Combiner = Combiner.NONE
    ids_per_example: int = 1
    initializer: Optional[object] = None

    def __post_init__(self):
        if not isinstance(self.combiner, Combiner):
            raise TypeError(f"table {self.name!r}: combiner must be a Combiner, got {self.combiner!r}")
        for key in ("vocab_size", "dim", "ids_per_example"):
            value = getattr(self, key)
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise ValueError(f"table {self.name!r}: {key} must be an integer >= 1, got {value!r}")


@dataclasses.dataclass(frozen=True)
class TPUEmbeddingPlan:
    """The configs of one model's tables for the TPU private step.

    Attributes:
      specs: the tables, in the model's order.
      tables: ``TableConfig`` per table name.
      features: the real ``FeatureConfig`` per table name.
      update_features: the update ``FeatureConfig`` per table name (``output_shape=[K]``).
      update_slots: ``K`` per table name.
      read_features: read-only ``FeatureConfig`` per table name (``output_shape=[N]``;
        e.g. a catalogue or sampled negatives), never given a gradient.
      optimizer: the table optimizer (SGD at rate 1).
      sparse_core: the ``SparseCoreEmbeddingConfig`` (``None`` off SparseCore).
      pipeline_execution_with_tensor_core: always ``False``.
    """

    specs: tuple
    tables: dict
    features: dict
    update_features: dict
    update_slots: dict
    optimizer: object
    sparse_core: Optional[object]
    pipeline_execution_with_tensor_core: bool = False
    read_features: dict = dataclasses.field(default_factory=dict)

    def feature_config(self) -> dict:
        """``{name: feature, name + "/update": update feature, name + "/read": read feature}``."""
        out = dict(self.features)
        out.update({name + UPDATE_SUFFIX: f for name, f in self.update_features.items()})
        out.update({name + READ_SUFFIX: f for name, f in self.read_features.items()})
        return out


def check_table_optimizer(optimizer, lazy_noise: bool) -> None:
    """Refuses table optimizers that break the DP step (see module doc); ``None`` passes.

    Example: ``check_table_optimizer(tf.tpu.experimental.embedding.SGD(1.0, clipvalue=1.0), False)``
    raises ``ValueError: table optimizer clipvalue ...``.
    """
    if optimizer is None:
        return
    if isinstance(optimizer, _api.SGD):
        _check_sgd(optimizer)
        return
    name = type(optimizer).__name__
    if lazy_noise:
        raise ValueError(
            f"table optimizer {name} with lazy noise (LazyDP): deferred noise reproduces DP-SGD only under "
            "plain SGD (a stateful optimizer changes rows by amounts the catch-up draw cannot match); use "
            "tf.tpu.experimental.embedding.SGD(learning_rate=1.0)"
        )
    raise ValueError(
        f"table optimizer {name} is refused: the private step sends each table's whole update as packed "
        "final rows through SGD at rate 1 (Adam, FTRL and momentum optimizers also move rows that only got a "
        "zero gradient, revealing which rows were looked up; Adagrad is post-processing but the emulator "
        "cannot verify it); use tf.tpu.experimental.embedding.SGD(learning_rate=1.0)"
    )


def _check_sgd(optimizer) -> None:
    if optimizer.clip_gradient_min is not None or optimizer.clip_gradient_max is not None:
        raise ValueError(
            f"table optimizer clipvalue=({optimizer.clip_gradient_min}, {optimizer.clip_gradient_max}) is refused: "
            "clipping the noised rows per coordinate changes the mechanism after noise; per-example clipping "
            "is done by the private step (l2_norm_clip)"
        )
    if optimizer.weight_decay_factor not in (None, 0, 0.0):
        raise ValueError(
            f"table optimizer weight_decay_factor={optimizer.weight_decay_factor} is refused: weight decay "
            "rewrites every looked-up row, revealing which rows a batch read"
        )
    if optimizer.clip_weight_min is not None or optimizer.clip_weight_max is not None:
        raise ValueError("table optimizer clip_weight_min/max is refused: it rewrites looked-up rows")
    if callable(optimizer.learning_rate) or float(optimizer.learning_rate) != 1.0:
        raise ValueError(
            f"table optimizer SGD learning_rate={optimizer.learning_rate!r}: must be 1.0 — the private step "
            "applies the learning rate and 1/B on the TensorCore, so a packed row is the whole change of its row"
        )


def check_execution(pipeline_execution_with_tensor_core: bool, allow_id_dropping: bool) -> None:
    """Refuses pipelined embedding updates and SparseCore id dropping (``ValueError``)."""
    if pipeline_execution_with_tensor_core:
        raise ValueError(
            "pipeline_execution_with_tensor_core=True is refused: step t+1's lookup would run before step t's "
            "update lands, which is not the trained algorithm (and breaks LazyDP's catch-up)"
        )
    if allow_id_dropping:
        raise ValueError(
            "allow_id_dropping=True is refused: SparseCore would silently drop ids beyond its limits, losing "
            "rows of the update feature (noise included); raise the limits instead"
        )


def _slots(update_slots: Union[int, Mapping[str, int]], names: Sequence[str]) -> dict:
    slots = {n: update_slots for n in names} if isinstance(update_slots, int) else dict(update_slots)
    missing = [n for n in names if n not in slots]
    if missing:
        raise ValueError(f"update_slots has no K for tables {missing}")
    for n in names:
        k = slots[n]
        if isinstance(k, bool) or int(k) != k or k < 1:
            raise ValueError(f"update_slots[{n!r}] must be an integer >= 1 (rows one step may update), got {k!r}")
    return {n: int(slots[n]) for n in names}


def build_plan(
    specs: Sequence[TableSpec],
    update_slots: Union[int, Mapping[str, int]],
    batch_size: int,
    table_optimizer=None,
    lazy_noise: bool = False,
    sparse_core: bool = False,
    allow_id_dropping: bool = False,
    pipeline_execution_with_tensor_core: bool = False,
    read_slots: Optional[Mapping[str, int]] = None,
) -> TPUEmbeddingPlan:
    """Configs for ``specs`` with ``K`` update slots per table (see module doc for the refusals).

    ``batch_size`` is the per-replica batch of the real features; it and
    ``K`` set SparseCore's limits (ids per table ``B L + K``, plus ``N`` of a
    read-only feature from ``read_slots``).
    """
    check_table_optimizer(table_optimizer, lazy_noise)
    check_execution(pipeline_execution_with_tensor_core, allow_id_dropping)
    specs = tuple(specs)
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"table names must be unique, got {names}")
    slots = _slots(update_slots, names)
    reads = dict(read_slots or {})
    unknown = sorted(set(reads) - set(names))
    if unknown:
        raise ValueError(f"read_slots names tables {unknown} that are not in {names}")
    optimizer = table_optimizer if table_optimizer is not None else _api.SGD(learning_rate=1.0)
    tables, features, updates = {}, {}, {}
    for s in specs:
        table = _api.TableConfig(vocabulary_size=s.vocab_size, dim=s.dim, initializer=s.initializer,
                                 optimizer=optimizer, combiner=s.combiner.table_combiner, name=s.name)
        tables[s.name] = table
        features[s.name] = _api.FeatureConfig(table=table, name=s.name)
        updates[s.name] = _api.FeatureConfig(table=table, output_shape=[slots[s.name]], name=s.name + UPDATE_SUFFIX)
    read_features = {n: _api.FeatureConfig(table=tables[n], output_shape=[int(k)], name=n + READ_SUFFIX)
                     for n, k in reads.items()}
    core = None
    if sparse_core:
        ids = {s.name: int(batch_size) * s.ids_per_example + slots[s.name] + int(reads.get(s.name, 0)) for s in specs}
        core = _api.SparseCoreEmbeddingConfig(
            max_ids_per_table=ids,
            max_unique_ids_per_table={s.name: min(ids[s.name], s.vocab_size) for s in specs},
            allow_id_dropping=False,
        )
    return TPUEmbeddingPlan(specs, tables, features, updates, slots, optimizer, core, False, read_features)
