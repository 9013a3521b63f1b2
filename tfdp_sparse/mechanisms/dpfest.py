"""DP-FEST: DP-SGD restricted to a per-feature set of top-k buckets.

DP-FEST (Ghazi et al., "Sparsity-Preserving Differentially Private Training
of Large Embedding Models", NeurIPS'23, §3.1 and App. B.1; DESIGN.md §2
item 4) keeps, before training, only ``k`` buckets (rows) of each feature's
embedding table and then trains with DP-SGD *restricted to the kept rows*:

* per table ``f`` with kept set ``K_f`` (``|K_f| = k_f``): the summed clipped
  gradient rows at ids in ``K_f`` plus ``N(0, sigma^2 C^2)`` on **every** kept
  row, every step (whether or not the batch looked it up); gradient entries
  of non-kept rows are dropped, so non-kept rows never change;
* dense variables: ordinary DP-SGD noise ``N(0, sigma^2 C^2)``.

The applied gradient is ``IndexedSlices(k_f rows)`` per table, so
``embedding_values = sum_f k_f * d_f`` every step.

Where the kept sets come from (exactly one source):

* ``frequency_file`` — a *public* prior (CSV ``feature,bucket,count``, see
  :mod:`tfdp_sparse.selection.frequency`); deterministic top-k, no privacy
  cost, ``setup_event()`` is ``None``;
* ``selection_epsilon`` — *private* one-shot Gumbel top-k on the training
  data's per-feature counts, which the trainer passes to
  :meth:`BucketSelection.select` (``mech.select(counts_per_table)``) before
  training (:mod:`tfdp_sparse.selection.gumbel`). Each example must add at
  most 1 to one bucket of each feature (single-id features; the analysis
  does not cover multi-id features). ``selection_epsilon`` is ``ε0`` of
  *each pick*: releasing ``k`` buckets of ``F`` features is ``F k``
  bounded-range picks, ``rho = sum_f k_f ε0² / 8`` zCDP — not ``ε0``-DP
  (the paper's erratum, DESIGN §2 item 4). ``setup_event()`` returns a
  ``GaussianDpEvent`` with the same RDP curve, to be composed with the
  training steps **in an RDP accountant only**: a PLD accountant would use
  the Gaussian's full privacy profile, which zCDP does not imply. Asking for
  ``accountant="pld"`` with private selection is refused with a
  ``ValueError``;
* ``kept_ids`` — explicit public kept sets (one id sequence per feature).

Tables and features. Feature ``f`` is the ``f``-th embedding table in the
order the tables appear among the variables given to ``privatize`` (the
``is_table`` ones, i.e. ``model.trainable_variables`` order). Trainers may
call ``bind_model(model)`` first: it finds the embedding layers (any layer
with an ``embeddings`` variable, e.g. ``DPEmbedding``), records their sizes
and, with the ``feature_names`` knob (layer names in feature order), maps
tables to features by layer name instead of position.

The kept ids live in non-trainable int64 variables of this module (sorted),
so a checkpoint carries the selection: a resumed run must restore it rather
than select again (a second private selection would spend its budget twice;
:meth:`BucketSelection.select` refuses when a selection exists). Create the
variables before restoring by calling ``bind_model(model)``.

Knobs (``PrivacyConfig.extra``):

* ``k`` — int (every feature), sequence (per feature, in feature order) or
  mapping ``{feature index or embedding layer name: k}``; ``0 <= k <= rows``.
* ``frequency_file`` — path of the public prior.
* ``selection_epsilon`` — ``ε0 > 0`` per Gumbel pick (private selection).
* ``kept_ids`` — explicit public kept sets, one id sequence per feature
  (``k`` is then optional).
* ``feature_names`` — optional embedding layer names in feature order.
* ``vocab_sizes`` — optional table sizes in feature order (lets the
  frequency file be read and checked at construction).

Example::

    config = PrivacyConfig(algorithm="dpfest", noise_multiplier=1.0,
                           accountant="rdp",
                           extra=(("k", 1000), ("selection_epsilon", 0.01)))
    mech = from_config(config, seed=0)
    mech.bind_model(model)
    mech.select(train_counts_per_feature)      # private Gumbel top-k
    ledger.record(mech.setup_event())          # rho-zCDP, RDP accountant
    # each step: ledger.record_step(mech.step_event(q))
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping
from typing import Optional, Sequence, Union

import dp_accounting
import numpy as np
import tensorflow as tf

from tfdp_sparse.mechanisms.base import (
    Gradient,
    Mechanism,
    NoisedGradients,
    sum_rows_at,
    validate_noise_multiplier,
)
from tfdp_sparse.mechanisms.dpsgd import gaussian_step_event, noise_dense
from tfdp_sparse.selection import frequency, gumbel
from tfdp_sparse.noise_source import NoiseSource

KSpec = Union[int, Sequence[int], Mapping]

MODES = ("frequency_file", "private", "given")


class _Plain:
    """Holder of plain Python settings (tf.Module does not wrap/track its contents)."""


class _Binding:
    """Plain (untracked) record of the model's tables, from ``bind_model``."""

    def __init__(self):
        self.feature_of: dict = {}  # variable ref -> feature index
        self.names: list[str] = []  # layer name per feature
        self.sizes: list[int] = []  # rows per feature


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_k_value(value, where: str) -> int:
    if not _is_int(value) or value < 0:
        raise ValueError(f"k={value!r} for {where} must be an integer >= 0 (buckets kept per feature)")
    return int(value)


def embedding_tables(model) -> list[tuple[tf.Variable, str]]:
    """``(table variable, layer name)`` of a model's embedding layers, in variable order.

    Duck-typed (any layer with an ``embeddings`` ``tf.Variable``), so this
    module needs no import of layers or models.
    """
    order = {v.ref(): i for i, v in enumerate(model.trainable_variables)}
    found = {}
    for layer in model.submodules:
        table = getattr(layer, "embeddings", None)
        if isinstance(table, tf.Variable) and table.ref() in order and table.ref() not in found:
            found[table.ref()] = (table, getattr(layer, "name", table.name))
    return sorted(found.values(), key=lambda item: order[item[0].ref()])


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
        given = {
            "frequency_file": frequency_file is not None,
            "selection_epsilon": selection_epsilon is not None,
            "kept_ids": kept_ids is not None,
        }
        if sum(given.values()) != 1:
            chosen = [name for name, on in given.items() if on] or "none"
            raise ValueError(
                "DP-FEST needs exactly one source of kept buckets: frequency_file (a public prior), "
                "selection_epsilon (private Gumbel top-k on training counts passed to select()) or "
                f"kept_ids (public, explicit); got {chosen}"
            )
        if kept_ids is None:
            if k is None:
                raise ValueError("k (buckets kept per feature) must be set for DP-FEST selection, got None")
            if isinstance(k, Mapping):
                for key, value in k.items():
                    _check_k_value(value, f"feature {key!r}")
            elif isinstance(k, (list, tuple, np.ndarray)):
                for f, value in enumerate(k):
                    _check_k_value(value, f"feature {f}")
            else:
                _check_k_value(k, "every feature")
        self._plain = _Plain()
        self._plain.k_spec = k
        if frequency_file is not None:
            self.mode = "frequency_file"
            if not os.path.isfile(os.fspath(frequency_file)):
                raise ValueError(f"frequency_file={os.fspath(frequency_file)!r} does not exist or is not a file")
            self.frequency_file = os.fspath(frequency_file)
        else:
            self.frequency_file = None
        if selection_epsilon is not None:
            self.mode = "private"
            if (
                not isinstance(selection_epsilon, numbers.Real)
                or isinstance(selection_epsilon, bool)
                or not math.isfinite(selection_epsilon)
                or selection_epsilon <= 0
            ):
                raise ValueError(
                    f"selection_epsilon={selection_epsilon!r} must be a finite number > 0 "
                    "(epsilon of each Gumbel top-k pick)"
                )
            if accountant == "pld":
                raise ValueError(
                    "accountant='pld' cannot account DP-FEST's private Gumbel selection: its cost is "
                    "rho-zCDP, expressed as a Gaussian event that is only valid for the RDP accountant "
                    "(rho-zCDP does not imply the Gaussian's full privacy profile that PLD would use). "
                    "Use accountant='rdp', or a public frequency_file"
                )
        self.selection_epsilon = None if selection_epsilon is None else float(selection_epsilon)
        if kept_ids is not None:
            self.mode = "given"
        self.accountant = accountant
        self._plain.feature_names = None if feature_names is None else [str(n) for n in feature_names]
        self._plain.vocab_sizes = None
        if vocab_sizes is not None:
            sizes = list(vocab_sizes)
            for f, size in enumerate(sizes):
                if not _is_int(size) or size < 1:
                    raise ValueError(f"vocab_sizes[{f}]={size!r} must be an integer >= 1")
            self._plain.vocab_sizes = [int(s) for s in sizes]
        self._binding = _Binding()
        self._plain.np_rng = NoiseSource(seed).numpy_generator(0x5E1EC7)
        self._selected = tf.Variable(False, trainable=False, name="selected")
        self._kept: list = []
        if self._plain.vocab_sizes is not None and kept_ids is None:
            sizes = self._plain.vocab_sizes
            self._check_k_fits(self.k_per_feature(len(sizes)), sizes)  # fail early
        if kept_ids is not None:
            self.set_kept_ids(kept_ids)
        elif self.mode == "frequency_file" and self._plain.vocab_sizes is not None:
            self._load_frequency_file(self._plain.vocab_sizes)

    # -- features -------------------------------------------------------------

    @property
    def is_private(self) -> bool:
        """True when the kept sets are chosen privately from training data."""
        return self.mode == "private"

    @property
    def required_accountant(self) -> Optional[str]:
        """``"rdp"`` when ``setup_event`` is only valid in an RDP accountant."""
        return "rdp" if self.is_private else None

    @property
    def is_selected(self) -> bool:
        """Whether kept sets exist (made here or restored from a checkpoint)."""
        with tf.init_scope():
            return bool(self._selected.numpy())

    def _sizes(self) -> Optional[list[int]]:
        if self._binding.sizes:
            return list(self._binding.sizes)
        return None if self._plain.vocab_sizes is None else list(self._plain.vocab_sizes)

    def _names(self, num_features: int) -> list:
        if self._plain.feature_names is not None:
            return list(self._plain.feature_names)
        if self._binding.names:
            return list(self._binding.names)
        return [None] * num_features

    def num_features(self) -> Optional[int]:
        """Number of features, when known (kept sets, binding, sizes or ``k``)."""
        for candidate in (self._kept, self._binding.sizes, self._plain.vocab_sizes, self._plain.feature_names):
            if candidate:
                return len(candidate)
        if isinstance(self._plain.k_spec, (list, tuple, np.ndarray)):
            return len(self._plain.k_spec)
        return None

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
        spec = self._plain.k_spec
        if isinstance(spec, Mapping):
            names = self._names(num_features)
            out = []
            for f in range(num_features):
                if f in spec:
                    out.append(_check_k_value(spec[f], f"feature {f}"))
                elif names[f] is not None and names[f] in spec:
                    out.append(_check_k_value(spec[names[f]], f"feature {names[f]!r}"))
                else:
                    raise ValueError(
                        f"k has no entry for feature {f}"
                        + (f" ({names[f]!r})" if names[f] is not None else "")
                        + f": k={dict(spec)!r}"
                    )
            unknown = [key for key in spec if key not in range(num_features) and key not in names]
            if unknown:
                raise ValueError(f"k names unknown features {unknown}; features are {names}")
            return out
        if isinstance(spec, (list, tuple, np.ndarray)):
            if len(spec) != num_features:
                raise ValueError(f"k has {len(spec)} entries but the model has {num_features} features (tables)")
            return [int(v) for v in spec]
        return [int(spec)] * num_features

    def _label(self, f: int) -> str:
        names = self._names(f + 1)
        name = names[f] if f < len(names) else None
        return f"feature {f}" + (f" ({name!r})" if name is not None else "")

    # -- binding ---------------------------------------------------------------

    def bind_model(self, model) -> None:
        """Maps the model's embedding tables to features and creates the kept-id variables."""
        tables = embedding_tables(model)
        if not tables:
            raise ValueError("bind_model: the model has no embedding table (a layer with an `embeddings` variable)")
        binding = _Binding()
        if self._plain.feature_names is not None:
            by_name = {name: (var, name) for var, name in tables}
            missing = [n for n in self._plain.feature_names if n not in by_name]
            if missing:
                raise ValueError(
                    f"feature_names {missing} match no embedding layer; the model's embedding layers are "
                    f"{[name for _, name in tables]}"
                )
            unlisted = [name for _, name in tables if name not in self._plain.feature_names]
            if unlisted:
                raise ValueError(
                    f"embedding layers {unlisted} are not in feature_names={self._plain.feature_names}: every "
                    "table needs a feature (and a kept set)"
                )
            ordered = [by_name[n] for n in self._plain.feature_names]
        else:
            ordered = tables
        for f, (var, name) in enumerate(ordered):
            binding.feature_of[var.ref()] = f
            binding.names.append(name)
            binding.sizes.append(int(var.shape[0]))
        if self._plain.vocab_sizes is not None and self._plain.vocab_sizes != binding.sizes:
            raise ValueError(f"vocab_sizes={self._plain.vocab_sizes} disagree with the model's tables {binding.sizes}")
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
        for f, (k, size) in enumerate(zip(ks, sizes)):
            if k > size:
                raise ValueError(f"k={k} exceeds the {size} rows of the table of {self._label(f)}")

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
        if self._plain.k_spec is not None and self.mode != "given":
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
                f = self._binding.feature_of.get(variables[i].ref())
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

    # -- accounting --------------------------------------------------------------

    def selection_rho(self) -> float:
        """zCDP ``rho = sum_f k_f ε0² / 8`` of the private selection (0 if public)."""
        if not self.is_private:
            return 0.0
        return float(sum(self.k_per_feature())) * gumbel.pick_zcdp(self.selection_epsilon)

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
        out = {"selection": self.mode, "k": self._plain.k_spec if not isinstance(self._plain.k_spec, Mapping) else dict(self._plain.k_spec)}
        if self.frequency_file is not None:
            out["frequency_file"] = self.frequency_file
        if self.is_private:
            out["selection_epsilon_per_pick"] = self.selection_epsilon
            out["required_accountant"] = "rdp"
            if self.num_features() is not None:
                out["selection_rho_zcdp"] = self.selection_rho()
        return out


#: Knobs of the bucket selection (shared by DP-FEST and DP-AdaFEST+).
SELECTION_KNOBS: frozenset = frozenset({"k", "frequency_file", "selection_epsilon", "kept_ids", "feature_names", "vocab_sizes"})


def selection_from_config(config, seed: Optional[int] = None) -> BucketSelection:
    """A :class:`BucketSelection` from the ``k`` / ``frequency_file`` / ``selection_epsilon`` /
    ``kept_ids`` / ``feature_names`` / ``vocab_sizes`` knobs."""
    return BucketSelection(
        config.knob("k"),
        frequency_file=config.knob("frequency_file"),
        selection_epsilon=config.knob("selection_epsilon"),
        kept_ids=config.knob("kept_ids"),
        feature_names=config.knob("feature_names"),
        vocab_sizes=config.knob("vocab_sizes"),
        accountant=config.accountant,
        seed=seed,
    )


class UsesSelection:
    """Trainer-facing API of mechanisms that hold a :class:`BucketSelection` as ``self.selection``."""

    selection: "BucketSelection"

    def bind_model(self, model) -> None:
        """See :meth:`BucketSelection.bind_model`."""
        self.selection.bind_model(model)

    def select(self, counts_per_table: Sequence) -> list[np.ndarray]:
        """Private Gumbel top-k from training counts; see :meth:`BucketSelection.select`."""
        return self.selection.select(counts_per_table)

    @property
    def required_accountant(self) -> Optional[str]:
        return self.selection.required_accountant

    @property
    def needs_private_selection(self) -> bool:
        return self.selection.is_private and not self.selection.is_selected


class DPFEST(UsesSelection, Mechanism):
    """DP-SGD noise on every kept row of every table, nothing elsewhere.

    Args:
      noise_multiplier: sigma.
      l2_norm_clip: C.
      selection: the kept sets (a :class:`BucketSelection`); or give ``k`` and
        one of ``frequency_file`` / ``selection_epsilon`` / ``kept_ids`` (and
        optionally ``feature_names``, ``vocab_sizes``, ``accountant``) to build one.
      seed: seed of the noise generator (and of the Gumbel selection).
    """

    name = "dpfest"

    def __init__(
        self,
        noise_multiplier: float,
        l2_norm_clip: float,
        k: Optional[KSpec] = None,
        *,
        selection: Optional[BucketSelection] = None,
        seed: Optional[int] = None,
        **selection_kwargs,
    ):
        super().__init__(l2_norm_clip=l2_norm_clip, seed=seed)
        self.noise_multiplier = validate_noise_multiplier(noise_multiplier)
        if selection is None:
            selection = BucketSelection(k, seed=seed, **selection_kwargs)
        elif k is not None or selection_kwargs:
            raise ValueError("give either selection=... or k and its source knobs, not both")
        self.selection = selection

    def privatize(
        self,
        grads: Sequence[Gradient],
        variables: Sequence[tf.Variable],
        is_table: Sequence[bool],
        lookups: Optional[Sequence[Optional[tf.Tensor]]] = None,
    ) -> NoisedGradients:
        del lookups  # the kept sets do not depend on the batch
        stddev = self.noise_multiplier * self.l2_norm_clip
        kept = self.selection.kept_sets(variables, is_table)
        out: list[Gradient] = []
        count = tf.constant(0, tf.int64)
        for grad, var, table, ids in zip(grads, variables, is_table, kept):
            if not table:
                out.append(noise_dense(self, grad, var, stddev))
                continue
            if grad is not None and not isinstance(grad, tf.IndexedSlices):
                raise TypeError(f"DP-FEST expects tf.IndexedSlices for embedding table {var.name}, got a dense tensor")
            k, width = int(ids.shape[0]), int(var.shape[-1])
            if k == 0:
                out.append(None)  # nothing kept: the table never changes
                continue
            rows = sum_rows_at(grad, ids, width)
            values = rows + self.gaussian_noise([k, width], stddev)
            out.append(tf.IndexedSlices(values, ids, tf.constant(var.shape.as_list(), tf.int64)))
            count += k * width
        return NoisedGradients(out, count)

    def step_event(self, sampling_probability: float) -> dp_accounting.DpEvent:
        """DP-SGD's step: ``PoissonSampled(q, Gaussian(sigma))`` (restriction is post-processing)."""
        return gaussian_step_event(self.noise_multiplier, sampling_probability)

    def setup_event(self) -> Optional[dp_accounting.DpEvent]:
        """The selection's one-off cost (RDP accountant only); ``None`` for a public prior."""
        return self.selection.setup_event()

    def describe(self) -> dict:
        return {**super().describe(), "noise_multiplier": self.noise_multiplier, **self.selection.describe()}


#: Knobs of ``PrivacyConfig.extra`` this algorithm accepts (the registry refuses others).
KNOBS: frozenset = SELECTION_KNOBS


def from_config(config, seed: Optional[int] = None) -> DPFEST:
    """Registry constructor; knobs ``k``, ``frequency_file``, ``selection_epsilon``,
    ``kept_ids``, ``feature_names``, ``vocab_sizes`` (see the module docstring)."""
    return DPFEST(
        config.noise_multiplier, config.l2_norm_clip, selection=selection_from_config(config, seed), seed=seed
    )
