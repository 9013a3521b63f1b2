"""DP-FEST's per-feature kept sets as a ``tf.Module`` (also DP-AdaFEST+'s preselection).

Ghazi et al., NeurIPS'23, §3.1 and App. B.1. Settings are validated by
:class:`tfdp_sparse.mechanisms.plans.selection.SelectionSettings`; this module
holds the state: kept ids in non-trainable int64 variables (sorted), so a
checkpoint carries the selection and a resumed run restores it (a second
private selection is refused: it would spend its budget twice). Call
``bind_model(model)`` before restoring. Feature ``f`` is the ``f``-th table
in ``model.trainable_variables`` order, or the table named ``feature_names[f]``
(an embedding layer's name; a hooked keras-rs table's ``"<layer>_<table>"``).

Example::

    sel = BucketSelection(10, selection_epsilon=0.1, accountant="rdp")
    sel.bind_model(model)
    sel.select(counts_per_table)      # private Gumbel top-k
    sel.setup_event()                 # rho-zCDP as an RDP-only Gaussian event
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Optional, Sequence, Union

import dp_accounting
import numpy as np
import tensorflow as tf

from tfdp_sparse.mechanisms.plans.base import TableInfo
from tfdp_sparse.mechanisms.plans.selection import SelectionSettings
from tfdp_sparse.mechanisms.tables import embedding_tables, variable_key
from tfdp_sparse.noise_source import NoiseSource
from tfdp_sparse.selection import frequency, gumbel

KSpec = Union[int, Sequence[int], Mapping]


class _Plain:
    """Holder of plain Python settings (tf.Module does not wrap/track its contents)."""


class _Binding:
    """Plain (untracked) record of the model's tables, from ``bind_model``."""

    def __init__(self):
        self.feature_of: dict = {}  # variable ref -> feature index
        self.names: list[str] = []  # layer name per feature
        self.sizes: list[int] = []  # rows per feature


class BucketSelection(tf.Module):
    """Per-feature kept sets of DP-FEST (also DP-AdaFEST+'s preselection).

    Args:
      k: buckets kept per feature (int, per-feature sequence, or mapping
        keyed by feature index or embedding layer name).
      frequency_file: public prior CSV (``feature,bucket,count``).
      selection_epsilon: ``ε0`` per pick of private Gumbel top-k.
      kept_ids: explicit public kept sets, one id array per feature.
      feature_names: embedding layer names in feature order (for
        ``bind_model``; otherwise features follow the order of the tables).
      vocab_sizes: table sizes in feature order (optional; otherwise taken
        from ``bind_model`` or the variables).
      accountant: the run's accountant (``"pld"`` / ``"rdp"``); ``"pld"`` with
        private selection raises ``ValueError`` (see module docstring).
      seed: ``None``: Gumbel noise from OS entropy (private); an integer:
        reproducible noise (tests, debugging; not private).
    """

    def __init__(
        self,
        k: Optional[KSpec],
        *,
        frequency_file: Optional[Union[str, os.PathLike]] = None,
        selection_epsilon: Optional[float] = None,
        kept_ids: Optional[Sequence] = None,
        feature_names: Optional[Sequence[str]] = None,
        vocab_sizes: Optional[Sequence[int]] = None,
        accountant: Optional[str] = None,
        seed: Optional[int] = None,
    ):
        super().__init__(name="bucket_selection")
        settings = SelectionSettings(
            k=k, frequency_file=frequency_file, selection_epsilon=selection_epsilon, kept_ids=kept_ids,
            feature_names=feature_names, vocab_sizes=vocab_sizes, accountant=accountant,
        )
        self._plain = _Plain()
        self._plain.settings = settings
        self._binding = _Binding()
        self._plain.np_rng = NoiseSource(seed).numpy_generator(0x5E1EC7)
        self._selected = tf.Variable(False, trainable=False, name="selected")
        self._kept: list = []
        if kept_ids is not None:
            self.set_kept_ids(kept_ids)
        elif self.mode == "frequency_file" and settings.vocab_sizes is not None:
            self._load_frequency_file(list(settings.vocab_sizes))

    @classmethod
    def from_settings(cls, settings: SelectionSettings, seed: Optional[int] = None) -> "BucketSelection":
        """The selection of validated :class:`SelectionSettings` (a plan's)."""
        return cls(settings.k, frequency_file=settings.frequency_file, selection_epsilon=settings.selection_epsilon,
                   kept_ids=settings.kept_ids, feature_names=settings.feature_names,
                   vocab_sizes=settings.vocab_sizes, accountant=settings.accountant, seed=seed)

    @property
    def settings(self) -> SelectionSettings:
        """The pure-Python settings (what a plan holds)."""
        return self._plain.settings

    mode = property(lambda self: self._plain.settings.mode, doc="``frequency_file``, ``private`` or ``given``.")
    frequency_file = property(lambda self: self._plain.settings.frequency_file, doc="Public prior path, if any.")
    selection_epsilon = property(lambda self: self._plain.settings.selection_epsilon, doc="ε0 per pick, if private.")
    accountant = property(lambda self: self._plain.settings.accountant, doc="The run's accountant.")

    # -- features -------------------------------------------------------------

    @property
    def is_private(self) -> bool:
        """True when the kept sets are chosen privately from training data."""
        return self._plain.settings.is_private

    @property
    def required_accountant(self) -> Optional[str]:
        """``"rdp"`` when ``setup_event`` is only valid in an RDP accountant."""
        return self._plain.settings.required_accountant

    @property
    def _vocab_sizes(self) -> Optional[list[int]]:
        sizes = self._plain.settings.vocab_sizes
        return None if sizes is None else list(sizes)

    @property
    def _feature_names(self) -> Optional[list[str]]:
        names = self._plain.settings.feature_names
        return None if names is None else list(names)

    @property
    def is_selected(self) -> bool:
        """Whether kept sets exist (made here or restored from a checkpoint)."""
        with tf.init_scope():
            return bool(self._selected.numpy())

    def _sizes(self) -> Optional[list[int]]:
        if self._binding.sizes:
            return list(self._binding.sizes)
        return None if self._vocab_sizes is None else list(self._vocab_sizes)

    def _names(self, num_features: int) -> list:
        if self._feature_names is not None:
            return list(self._feature_names)
        if self._binding.names:
            return list(self._binding.names)
        return [None] * num_features

    def num_features(self) -> Optional[int]:
        """Number of features, when known (kept sets, binding, sizes or ``k``)."""
        for candidate in (self._kept, self._binding.sizes, self._vocab_sizes, self._feature_names):
            if candidate:
                return len(candidate)
        return self._plain.settings.num_features()

    def k_per_feature(self, num_features: Optional[int] = None) -> list[int]:
        """``k_f`` for every feature (in feature order)."""
        if self._kept:
            return [int(v.shape[0]) for v in self._kept]
        num_features = num_features if num_features is not None else self.num_features()
        if num_features is None:
            raise ValueError(
                "the number of features is unknown: give k per feature, vocab_sizes or feature_names, "
                "or call bind_model(model) / select(counts) first"
            )
        return self._plain.settings.k_per_feature(num_features, self._names(num_features))

    def _label(self, f: int) -> str:
        names = self._names(f + 1)
        name = names[f] if f < len(names) else None
        return f"feature {f}" + (f" ({name!r})" if name is not None else "")

    # -- binding ---------------------------------------------------------------

    def bind_model(self, model) -> None:
        """Maps the model's embedding tables to features and creates the kept-id variables.

        The tables: :func:`~tfdp_sparse.mechanisms.tables.embedding_tables` (embedding layers, named by
        layer, and hooked tables such as keras-rs ``DistributedEmbedding``'s, named ``"rs_t1"``).
        """
        tables = embedding_tables(model)
        if not tables:
            raise ValueError("bind_model: the model has no embedding table (a layer with an `embeddings` variable, "
                             "or a hooked table: keras-rs DistributedEmbedding tables are hooked by make_private, or "
                             "call tfdp_sparse.keras.keras_rs_support.hook_keras_rs_tables(model) first)")
        binding = _Binding()
        if self._feature_names is not None:
            by_name = {name: (var, name) for var, name in tables}
            missing = [n for n in self._feature_names if n not in by_name]
            if missing:
                raise ValueError(
                    f"feature_names {missing} match no embedding layer; the model's embedding layers are "
                    f"{[name for _, name in tables]}"
                )
            unlisted = [name for _, name in tables if name not in self._feature_names]
            if unlisted:
                raise ValueError(
                    f"embedding layers {unlisted} are not in feature_names={self._feature_names}: every "
                    "table needs a feature (and a kept set)"
                )
            ordered = [by_name[n] for n in self._feature_names]
        else:
            ordered = tables
        for f, (var, name) in enumerate(ordered):
            binding.feature_of[variable_key(var)] = f
            binding.names.append(name)
            binding.sizes.append(int(var.shape[0]))
        if self._vocab_sizes is not None and self._vocab_sizes != binding.sizes:
            raise ValueError(f"vocab_sizes={self._vocab_sizes} disagree with the model's tables {binding.sizes}")
        if self._kept and len(self._kept) != len(binding.sizes):
            raise ValueError(
                f"the selection has {len(self._kept)} features but the model has {len(binding.sizes)} tables"
            )
        self._binding = binding
        ks = self.k_per_feature(len(binding.sizes))
        self._check_k_fits(ks, binding.sizes)
        self._ensure_variables(ks)
        if self.mode == "frequency_file" and not self.is_selected:
            self._load_frequency_file(binding.sizes)

    def _check_k_fits(self, ks: Sequence[int], sizes: Sequence[int]) -> None:
        SelectionSettings.check_k_fits(ks, sizes, self._label)

    def _ensure_variables(self, ks: Sequence[int]) -> None:
        if self._kept:
            have = [int(v.shape[0]) for v in self._kept]
            if have != list(ks):
                raise ValueError(f"kept sets have sizes {have}, expected k={list(ks)}")
            return
        with tf.init_scope():
            self._kept = [
                tf.Variable(tf.zeros([k], tf.int64), trainable=False, name=f"kept_ids_{f}") for f, k in enumerate(ks)
            ]

    # -- selection -------------------------------------------------------------

    def set_kept_ids(self, kept_ids: Sequence) -> None:
        """Installs explicit (public) kept sets, one id array per feature."""
        arrays = []
        for f, ids in enumerate(kept_ids):
            arr = np.asarray(ids)
            if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
                raise ValueError(f"kept_ids for {self._label(f)} must be a 1-D array of integer row ids")
            arrays.append(arr.astype(np.int64))
        self._install(arrays)

    def _install(self, arrays: Sequence[np.ndarray]) -> None:
        sizes = self._sizes()
        if sizes is not None and len(sizes) != len(arrays):
            raise ValueError(f"got kept sets for {len(arrays)} features but the model has {len(sizes)} tables")
        if self._plain.settings.k is not None and self.mode != "given":
            ks = self.k_per_feature(len(arrays))
            for f, (k, arr) in enumerate(zip(ks, arrays)):
                if arr.size != k:
                    raise ValueError(f"{arr.size} kept ids for {self._label(f)}, expected k={k}")
        cleaned = []
        for f, arr in enumerate(arrays):
            arr = np.sort(arr.astype(np.int64))
            if arr.size and (arr[0] < 0 or (sizes is not None and arr[-1] >= sizes[f])):
                rows = "the table's rows" if sizes is None else f"{sizes[f]}"
                raise ValueError(f"kept ids of {self._label(f)} must lie in [0, {rows}), got {arr[0]}..{arr[-1]}")
            if np.any(arr[1:] == arr[:-1]):
                raise ValueError(f"kept ids of {self._label(f)} contain duplicates")
            cleaned.append(arr)
        if sizes is not None:
            self._check_k_fits([a.size for a in cleaned], sizes)
        self._ensure_variables([a.size for a in cleaned])
        with tf.init_scope():
            for var, arr in zip(self._kept, cleaned):
                var.assign(arr)
            self._selected.assign(True)

    def _load_frequency_file(self, sizes: Sequence[int]) -> None:
        ks = self.k_per_feature(len(sizes))
        self._check_k_fits(ks, sizes)
        try:
            counts = frequency.load_frequency_file(self.frequency_file, list(sizes), dense=False)
        except ValueError as err:
            raise ValueError(f"frequency_file={self.frequency_file!r} is invalid: {err}") from None
        chosen = [
            frequency.top_k_from_counts(c, k, feature=self._label(f), table_size=size)
            for f, (c, k, size) in enumerate(zip(counts, ks, sizes))
        ]
        self._install(chosen)

    def select(self, counts_per_table: Sequence) -> list[np.ndarray]:
        """Private Gumbel top-k from the training data's per-feature counts.

        Args:
          counts_per_table: one dense count array per feature (feature
            order), over the whole table (zeros included), where each
            example adds at most 1 to one bucket of the feature.

        Returns:
          The kept ids per feature (sorted). The privacy cost is
          :meth:`setup_event` (compose it with training in an RDP ledger).
        """
        if self.mode != "private":
            raise ValueError(
                f"select(counts) runs the private selection, but this DP-FEST uses {self.mode!r}; set "
                "selection_epsilon (and no frequency_file / kept_ids) to select from training counts"
            )
        if self.is_selected:
            raise RuntimeError(
                "a selection already exists (made earlier or restored from a checkpoint); selecting again "
                "would spend the selection budget twice"
            )
        counts = [np.asarray(c) for c in counts_per_table]
        sizes = self._sizes()
        if sizes is not None:
            if len(counts) != len(sizes):
                raise ValueError(f"counts for {len(counts)} features, but the model has {len(sizes)} tables")
            for f, (c, size) in enumerate(zip(counts, sizes)):
                if c.ndim != 1 or c.size != size:
                    raise ValueError(
                        f"counts of {self._label(f)} must be dense over the table's {size} rows, "
                        f"got shape {c.shape}"
                    )
        ks = self.k_per_feature(len(counts))
        self._check_k_fits(ks, [c.size for c in counts])
        chosen = [
            gumbel.gumbel_top_k(c, k, self.selection_epsilon, self._plain.np_rng, feature=self._label(f))
            for f, (c, k) in enumerate(zip(counts, ks))
        ]
        self._install(chosen)
        return [np.sort(c) for c in chosen]

    def kept_ids_numpy(self) -> list[np.ndarray]:
        """The kept ids per feature (sorted), e.g. for logs or tests."""
        with tf.init_scope():
            return [v.numpy() for v in self._kept]

    # -- use in a step -----------------------------------------------------------

    def kept_sets(self, variables: Sequence[tf.Variable], is_table: Sequence[bool]) -> list[Optional[tf.Tensor]]:
        """Sorted kept ids (int64) per variable: a tensor for tables, ``None`` otherwise.

        Reads a public frequency file on first use if needed; a private
        selection must have been made (``select``) or restored.
        """
        positions = [i for i, t in enumerate(is_table) if t]
        if self._binding.feature_of:
            features = []
            for i in positions:
                f = self._binding.feature_of.get(variable_key(variables[i]))
                if f is None:
                    raise ValueError(f"embedding table {variables[i].name} was not seen by bind_model(model)")
                features.append(f)
        else:
            features = list(range(len(positions)))
        if not self.is_selected:
            if self.mode == "frequency_file":
                sizes = [0] * len(positions)
                for i, f in zip(positions, features):
                    sizes[f] = int(variables[i].shape[0])
                self._load_frequency_file(sizes)
            else:
                raise ValueError(
                    "DP-FEST with private selection needs its kept sets before training: call "
                    "select(counts_per_table) (or restore them from a checkpoint) first"
                )
        if len(self._kept) != len(positions):
            raise ValueError(
                f"the selection has {len(self._kept)} features but the step has {len(positions)} embedding tables"
            )
        sizes = self._sizes()
        out: list[Optional[tf.Tensor]] = [None] * len(variables)
        for i, f in zip(positions, features):
            rows = int(variables[i].shape[0])
            if sizes is not None and sizes[f] != rows:
                raise ValueError(f"{self._label(f)} has {sizes[f]} rows in the selection, table {variables[i].name} {rows}")
            if int(self._kept[f].shape[0]) > rows:
                raise ValueError(f"k={int(self._kept[f].shape[0])} exceeds the {rows} rows of table {variables[i].name}")
            out[i] = self._kept[f].read_value()
        return out

    def kept_of(self, table: tf.Variable) -> tf.Tensor:
        """The sorted kept ids (int64) of one table seen by :meth:`bind_model`.

        For callers that handle one table at a time (the lazy rule's flush,
        :mod:`tfdp_sparse.mechanisms.dpfest_lazy`). Example:
        ``selection.kept_of(model.get_layer("movie").embeddings)`` -> ``[k]``.
        """
        f = self._binding.feature_of.get(variable_key(table))
        if f is None:
            raise ValueError(f"table {table.name} was not seen by bind_model(model)")
        if not self.is_selected and self.mode == "frequency_file":
            self._load_frequency_file(self._binding.sizes)
        if not self.is_selected:
            raise ValueError("DP-FEST has no kept sets yet: call select(counts_per_table) (or restore them) first")
        return self._kept[f].read_value()

    # -- accounting --------------------------------------------------------------

    def table_infos(self) -> Optional[list[TableInfo]]:
        """The bound tables (name, rows), or the kept sets' sizes when only those are known."""
        if self._binding.sizes:
            return [TableInfo(n, r) for n, r in zip(self._binding.names, self._binding.sizes)]
        if self._kept:
            names = self._names(len(self._kept))
            return [TableInfo(n, int(v.shape[0])) for n, v in zip(names, self._kept)]
        return None

    def selection_rho(self) -> float:
        """zCDP ``rho = sum_f k_f ε0² / 8`` of the private selection (0 if public)."""
        return self._plain.settings.rho(self.k_per_feature()) if self.is_private else 0.0

    def setup_event(self) -> Optional[dp_accounting.DpEvent]:
        """One-off cost of the selection: ``None`` (public) or the RDP-only Gaussian event.

        ``GaussianDpEvent(1/sqrt(2 rho))`` has exactly the selection's RDP
        curve ``rho * alpha``; compose it with the training steps in an RDP
        accountant (``PrivacyLedger.epsilon(delta, accountant="rdp")``), never PLD.
        """
        if not self.is_private:
            return None
        return gumbel.selection_dp_event(self.selection_rho())

    def describe(self) -> dict:
        ks = self.k_per_feature() if self.is_private and self.num_features() is not None else None
        return self._plain.settings.describe(ks)
