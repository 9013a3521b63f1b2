"""Read hooks of embedding tables: what must run before a table's rows are read (LazyDP's catch-up).

A mechanism that defers work on rows until they are read (LazyDP's owed
noise) registers two hooks per table, each ``hook(table, unique_ids)``:

* a *read hook*, run with the unique ids a training read is about to gather
  (registered with ``corrects=True``, it is also called with ``correct=True`` by
  readers that apply a :class:`RowCorrection`, ``DPEmbedding``'s lookups, and may
  return one: the values the reader subtracts from the rows it gathers, and the
  table write it builds after that gather);
* an *inference hook*, run before reads outside training (evaluation,
  ``predict``, serving, saving), e.g. to apply all pending noise first.

:class:`ReadHooks` holds one table's hooks and their owners (weakly: a table
never keeps a mechanism alive; guards find the mechanisms through
:meth:`ReadHooks.owners`). A layer that reads one table through hooks of its own is a
:class:`HookedLayer` (:class:`tfdp_sparse.layers.DPEmbedding`): mechanisms bind to that type, so they
need not import the layers.

A layer that gathers rows of its tables itself, with no hook of its own
(keras-rs ``DistributedEmbedding``), gets a :class:`HookedTables`, one
:class:`ReadHooks` per named table, through :func:`hook_tables`: the clipping
rule of that layer runs the hooks before its gathers, the mechanism's
``bind_model`` finds the tables with :func:`hooked_tables_of`, and the
layer's ``save_own_variables`` (Keras 3's ``model.save`` / ``save_weights``)
runs the inference hooks of every row before the tables are written. Both
live on the layer instance (no module-level map), as
:func:`tfdp_sparse.clipping.registry.attach_taps`'s wrappers do. This module
imports TensorFlow and :mod:`tfdp_sparse.xla` only (no keras-rs, no mechanism). Under XLA the ids a hook
receives are fixed-size slots, ``-1`` in the empty ones (:func:`tfdp_sparse.xla.unique_ids`).

Example::

    hooked = hook_tables(layer, {"t1": table})      # once, before bind_model
    hooked.hooks("t1").add_read_hook(mech.catch_up, owner=mech)
    with tf.control_dependencies(hooked.before_read("t1", ids, training=True)):
        rows = tf.gather(table, ids)                 # caught-up rows
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Callable, Iterable, Iterator, Mapping, Optional

import tensorflow as tf

from tfdp_sparse.xla import unique_ids

ReadHook = Callable[..., Optional[object]]

# The attribute of a layer instance holding its HookedTables (set by hook_tables, read by hooked_tables_of).
_HOOKED = "_tfdp_hooked_tables"


@dataclasses.dataclass(frozen=True)
class RowCorrection:
    """What a correcting read hook returns to a reader that can apply it: the read rows' owed change.

    ``values[j]`` is subtracted from the row of the ``j``-th unique id the hook was given, as the
    reader reads it; ``write()`` builds the op that subtracts the same values from the table, and
    the reader calls it after its gather, so the gather does not wait for the write (the write
    waits for the gather). The rows read are the rows the table holds after the write, value for
    value. LazyDP's catch-up of a whole table (:mod:`tfdp_sparse.mechanisms.lazydp_catchup`), as its
    parameter-server catch-up reads rows less their owed noise from one gather.
    """

    values: tf.Tensor
    write: Callable[[], object]


class ReadHooks:
    """The read and inference hooks of one table, with their owners held weakly.

    Example::

        hooks = ReadHooks()
        hooks.add_read_hook(mech.catch_up, owner=mech)
        hooks.run(table, unique_ids, training=True)   # [op of the catch-up]
        hooks.owners()                                 # [mech]
    """

    def __init__(self):
        self._read: list[ReadHook] = []
        self._corrects: list[bool] = []  # aligned with _read: the hook takes correct=True (RowCorrection)
        self._inference: list[ReadHook] = []
        self._owners: list = []  # weakref.ref

    def add_read_hook(self, hook: ReadHook, owner: Optional[object] = None, corrects: bool = False) -> None:
        """Registers ``hook(table, unique_ids)`` to run before training reads; ``owner`` is remembered weakly.

        ``corrects``: the hook also takes ``correct=True``, from a reader that applies a
        :class:`RowCorrection` (``DPEmbedding``'s lookups), and may then return one instead of an op.
        """
        self._read.append(hook)
        self._corrects.append(bool(corrects))
        self._remember(owner)

    def add_inference_hook(self, hook: ReadHook, owner: Optional[object] = None) -> None:
        """Registers ``hook(table, unique_ids)`` to run before reads outside training."""
        self._inference.append(hook)
        self._remember(owner)

    def _remember(self, owner: Optional[object]) -> None:
        if owner is not None and owner not in self.owners():
            self._owners.append(weakref.ref(owner))

    def owners(self) -> list:
        """The live owners of these hooks, in registration order."""
        return [o for o in (ref() for ref in self._owners) if o is not None]

    def hooks(self, training) -> list:
        """The read hooks (``training`` truthy) or the inference hooks."""
        return self._read if training else self._inference

    def run(self, table, unique_ids: tf.Tensor, training, shard_ids: Optional[list] = None,
            correct: bool = False) -> list:
        """Runs the read (``training``) or inference hooks for ``unique_ids``; returns what they returned.

        ``shard_ids`` (sharded tables, training reads) is passed on to hooks
        that work on the servers (:class:`tfdp_sparse.tables.shards.ShardRows`).
        ``correct`` (training reads of a reader that applies :class:`RowCorrection`): passed on to
        the hooks registered with ``corrects=True``, which may return one.
        """
        out = []
        hooks = self.hooks(training)
        corrects = self._corrects if training else [False] * len(hooks)
        for hook, takes in zip(hooks, corrects):
            if shard_ids is not None:
                result = hook(table, unique_ids, shard_ids)
            elif correct and takes:
                result = hook(table, unique_ids, correct=True)
            else:
                result = hook(table, unique_ids)
            if result is not None:
                out.append(result)
        return out


class HookedLayer:
    """A layer that reads its one table through read hooks of its own (the toolkit's ``DPEmbedding``).

    The type by which mechanisms find such layers (LazyDP's ``bind_model``, the
    pending-noise guards) without importing the layers package. A subclass sets
    ``self._read_hooks = ReadHooks()`` in its constructor, defines :attr:`table`, and
    runs ``self._read_hooks`` before each gather (a training read with
    ``training=True``, any other read with ``training=False``).

    Example::

        class MyTable(tf.keras.layers.Layer, HookedLayer): ...
        layer.add_read_hook(mech.catch_up, owner=mech)
        layer.hook_owners()          # [mech]
    """

    _read_hooks: ReadHooks

    @property
    def table(self) -> tf.Variable:
        """The table's ``tf.Variable`` (or ``ShardedVariable``)."""
        raise NotImplementedError

    def add_read_hook(self, hook: ReadHook, owner: Optional[object] = None, corrects: bool = False) -> None:
        """Registers ``hook(table, unique_ids)`` to run before rows are read (:meth:`ReadHooks.add_read_hook`).

        ``owner`` (e.g. the LazyDP mechanism whose hook it is) is remembered
        weakly, so guards find it through :meth:`hook_owners`. ``corrects``: the hook
        takes ``correct=True`` from the layer's lookups and may return a :class:`RowCorrection`.
        """
        self._read_hooks.add_read_hook(hook, owner, corrects=corrects)

    def add_inference_hook(self, hook: ReadHook, owner: Optional[object] = None) -> None:
        """Registers ``hook(table, unique_ids)`` to run before reads outside training."""
        self._read_hooks.add_inference_hook(hook, owner)

    def hook_owners(self) -> list:
        """The (live) owners of this layer's hooks, in registration order."""
        return self._read_hooks.owners()


class HookedTables:
    """:class:`ReadHooks` for each named table of a layer that reads its tables itself.

    Args:
      tables: ``{table name: tf.Variable}`` (e.g. keras-rs ``layer.get_embedding_tables()``).

    Example::

        hooked = HookedTables({"t1": t1, "t2": t2})
        hooked.before_read("t1", ids, training=True)           # t1's read hooks, unique ids of ids
        hooked.before_read_all(training=False)                # every table's inference hooks, all rows
    """

    def __init__(self, tables: Mapping[str, tf.Variable]):
        for name, table in tables.items():
            if not isinstance(table, tf.Variable):
                raise TypeError(f"table {name!r}: read hooks need a tf.Variable, got {type(table).__name__}")
        self._tables = dict(tables)
        self._hooks = {name: ReadHooks() for name in self._tables}

    def tables(self) -> dict:
        """``{table name: tf.Variable}``, in the layer's order."""
        return dict(self._tables)

    def hooks(self, name: str) -> ReadHooks:
        """The hooks of table ``name``."""
        return self._hooks[name]

    def before_read(self, name: str, ids: tf.Tensor, training) -> list:
        """Runs table ``name``'s read (``training``) or inference hooks for the unique values of ``ids``.

        ``ids``: the ids about to be gathered, any shape. Returns the hooks' ops; builds nothing without hooks.
        """
        hooks = self._hooks[name]
        if not hooks.hooks(training):
            return []
        return hooks.run(self._tables[name], unique_ids(ids, tf.ones_like(tf.reshape(ids, [-1]), tf.bool)), training)

    def before_read_all(self, training) -> list:
        """Runs every table's hooks as for a read of all its rows (builds nothing without hooks)."""
        ops = []
        for name, table in self._tables.items():
            if self._hooks[name].hooks(training):
                ops += self._hooks[name].run(table, tf.range(int(table.shape[0]), dtype=tf.int64), training)
        return ops


def hooked_table_name(layer, name: str) -> str:
    """How mechanisms name table ``name`` of hooked ``layer`` (histories, kept sets, ``feature_names``).

    Example: ``hooked_table_name(model.get_layer("rs"), "t1")`` is ``"rs_t1"``.
    """
    return f"{layer.name}_{name}"


def hooked_tables_of(layer) -> Optional[HookedTables]:
    """The :class:`HookedTables` :func:`hook_tables` gave ``layer``, else ``None``."""
    return vars(layer).get(_HOOKED)


@dataclasses.dataclass(frozen=True)
class HookedTable:
    """One hooked table as mechanisms and guards see it.

    Attributes:
      layer: the layer that reads the table itself (keras-rs ``DistributedEmbedding``).
      name: :func:`hooked_table_name` of the table (``"rs_t1"``).
      table: the ``tf.Variable``.
      hooks: its :class:`ReadHooks`.
    """

    layer: object
    name: str
    table: tf.Variable
    hooks: ReadHooks


def hooked_tables_in(layers: Iterable) -> Iterator[HookedTable]:
    """Every hooked table of ``layers`` (in their order, each table once).

    The one walk over hooked tables that binding (LazyDP), DP-FEST's table
    list and the guards' owner lookup share.

    Example::

        [t.name for t in hooked_tables_in(layers_of(model))]   # ["rs_t1", "rs_t2"]
    """
    seen: set = set()
    for layer in layers:
        hooked = hooked_tables_of(layer)
        for name, table in (hooked.tables().items() if hooked is not None else ()):
            if table.ref() not in seen:
                seen.add(table.ref())
                yield HookedTable(layer, hooked_table_name(layer, name), table, hooked.hooks(name))


def hook_tables(layer, tables: Mapping[str, tf.Variable]) -> HookedTables:
    """Gives ``layer`` read hooks for ``tables`` (idempotent: a hooked layer keeps its hooks).

    Also wraps the instance's ``save_own_variables`` (Keras 3 writes a layer's
    state through it, the layer before its sub-layers) so that every table's
    inference hooks run before anything is written: ``model.save`` and
    ``save_weights`` store no row that still owes noise.
    """
    hooked = hooked_tables_of(layer)
    if hooked is not None:
        if {n: t.ref() for n, t in hooked.tables().items()} != {n: t.ref() for n, t in tables.items()}:
            raise ValueError(f"layer {layer.name!r} is already hooked with other tables: {sorted(hooked.tables())}")
        return hooked
    hooked = HookedTables(tables)
    own_save = layer.save_own_variables

    def save_own_variables(store) -> None:
        hooked.before_read_all(training=False)  # e.g. LazyDP flushes the tables first
        own_save(store)

    object.__setattr__(layer, _HOOKED, hooked)  # instance attributes; Keras' tracking bypassed
    object.__setattr__(layer, "save_own_variables", save_own_variables)
    return hooked
