"""The run's privacy ledger: counted DpEvents in order, plus non-DP marks.

A trainer records what each step costs (`record_step`) and one-off releases
such as a private vocabulary or bucket selection (`record`); the ledger
composes them and reports ε through the accountant (PLD by default,
Doroshenko et al. 2022; RDP, Mironov 2017). It is JSON-serialisable, so
checkpoints carry the spent budget and a resumed run continues it.
Fixed-size Poisson batches that may truncate add their truncation
probabilities (`record_truncation`); ε then leaves that share of δ to them
(:mod:`tfdp_sparse.accounting.truncation`).

Example (the classic MNIST DP-SGD setting, Abadi et al. 2016)::

    >>> ledger = PrivacyLedger()
    >>> ledger.record(dp_accounting.LaplaceDpEvent(10.0))   # e.g. a selection
    >>> ledger.record_step(dp_accounting.PoissonSampledDpEvent(
    ...     256 / 60000, dp_accounting.GaussianDpEvent(1.1)), num_steps=14062)
    >>> ledger.steps, len(ledger.entries)
    (14062, 2)
    >>> PrivacyLedger.from_json(ledger.to_json()).entries == ledger.entries
    True
"""
from __future__ import annotations

import json
import math
from typing import Any, Optional, Sequence

import dp_accounting

from tfdp_sparse.accounting.epsilon import _contains, epsilon_from_event
from tfdp_sparse.accounting.event_json import event_from_dict, event_to_dict
from tfdp_sparse.accounting.truncation import epsilon_with_truncation
from tfdp_sparse.accounting.validation import (
    _is_real, _validate_accountant, _validate_int, validate_delta)

_LEDGER_FORMAT = "tfdp_sparse.PrivacyLedger"

#: Why fixed-size shuffled batches void the guarantee: one text for the trainers and ``fit`` (a tf.data.Dataset).
SHUFFLED_BATCHES = ("fixed-size shuffled batches (the trainers' --sampling=shuffle, or a tf.data.Dataset given to fit): "
                    "epsilon assumes Poisson sampling")
#: Version 2 adds ``void_reasons``; version 3 the ``privacy_unit``; version 4 the
#: ``truncation_mass``. Versions 1 to 3 (no void reasons / example level, the only
#: unit they knew / no truncated batches) still load.
_LEDGER_VERSION = 4
_READABLE_VERSIONS = (1, 2, 3, 4)
#: The unit of every ledger written before units existed.
_DEFAULT_UNIT = "example"


class PrivacyNotAvailable(RuntimeError):
    """Raised when (ε, δ) is asked of a run that contains non-DP steps.

    EANA, for example, adds noise only to the rows a batch touched; it has no
    (ε, δ) guarantee against an adversary who sees intermediate models, so its
    ledger is marked with `PrivacyLedger.record_not_private(reason)`.
    """

    def __init__(self, reasons: Sequence[str] | str) -> None:
        if isinstance(reasons, str):
            reasons = (reasons,)
        self.reasons: tuple[str, ...] = tuple(reasons)
        self.reason: str = "; ".join(self.reasons)
        super().__init__(
            "(epsilon, delta) is not available for this run: " + self.reason)


# Why not dp_accounting.DpEventBuilder: the builder also merges consecutive
# equal events and flattens SelfComposedDpEvent, but (1) each ledger entry
# carries a not-private reason, and entries merge only when event *and*
# reason match; (2) `composed_event()` (and so every ε reported so far) is one
# SelfComposedDpEvent per entry, while `build()` unwraps count-1 and
# single-entry compositions; (3) the builder rejects count 0 and numpy
# integers, which `record` accepts; and (4) its (event, count) list is private,
# yet `to_json`, `copy` and `entries` need it. Using it would change the
# ledger's events or its JSON, so the ledger keeps its own merge.


class PrivacyLedger:
    """The run's privacy history: counted DpEvents in order, plus non-DP marks.

    Consecutive identical events merge into one `(event, count)` entry, so a
    run of 10^6 identical steps is one entry. `SelfComposedDpEvent(e, n)` is
    recorded as `e` with count `n`. A non-private step (EANA) is recorded with
    `record_not_private(reason)`; it is kept as a `NonPrivateDpEvent` entry
    and makes `epsilon()` raise `PrivacyNotAvailable(reason)`.

    >>> ledger = PrivacyLedger()
    >>> step = dp_accounting.PoissonSampledDpEvent(
    ...     256 / 60000, dp_accounting.GaussianDpEvent(1.1))
    >>> for _ in range(14062):
    ...     ledger.record_step(step)
    >>> ledger.steps, len(ledger.entries)
    (14062, 1)
    >>> round(ledger.epsilon(1e-5, "rdp"), 3)
    2.597
    >>> PrivacyLedger.from_json(ledger.to_json()).entries == ledger.entries
    True
    """

    def __init__(self) -> None:
        # Each entry: [event, count, reason or None].
        self._entries: list[list[Any]] = []
        self._steps = 0
        self._void: list[str] = []
        self._unit = _DEFAULT_UNIT
        self._truncation_mass = 0.0
        # (delta, accountant) -> (epsilon, truncation delta share).
        self._cache: dict[tuple[float, str], tuple[float, float]] = {}

    # -- recording ----------------------------------------------------------

    def record(self, event: dp_accounting.DpEvent, count: int = 1) -> None:
        """Records `count` applications of `event` (not counted as steps)."""
        self._record(event, count, None)

    def record_step(self, event: dp_accounting.DpEvent,
                    num_steps: int = 1) -> None:
        """Records `num_steps` training steps, each described by `event`."""
        num_steps = _validate_int("num_steps", num_steps, 0)
        self._record(event, num_steps, None)
        self._steps += num_steps

    def record_not_private(self, reason: str, num_steps: int = 0) -> None:
        """Marks the run as not DP (e.g. EANA); `epsilon()` will then raise.

        `num_steps` training steps are counted as well (0 by default).
        """
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError(
                f"reason={reason!r} is invalid: give a non-empty explanation "
                "of why the step has no (epsilon, delta) guarantee")
        num_steps = _validate_int("num_steps", num_steps, 0)
        self._record(dp_accounting.NonPrivateDpEvent(), max(num_steps, 1),
                     reason)
        self._steps += num_steps

    def record_run_voids(self, noise_reason: Optional[str], shuffled: bool) -> None:
        """Marks what every run driver checks before its first step: reproducible noise and shuffled batches.

        ``noise_reason``: the noise source's ``not_private_reason`` (``None`` for secure noise);
        ``shuffled``: fixed-size shuffled batches instead of Poisson samples (:data:`SHUFFLED_BATCHES`).
        The trainers and ``make_private``'s ``fit`` both call it, so a run is voided for the same
        reasons in the same words on both paths.

        >>> ledger = PrivacyLedger()
        >>> ledger.record_run_voids(None, shuffled=True)
        >>> ledger.void_reasons == (SHUFFLED_BATCHES,)
        True
        """
        for reason in (noise_reason, SHUFFLED_BATCHES if shuffled else None):
            if reason:
                self.record_void(reason)

    def record_void(self, reason: str) -> None:
        """Marks the run's guarantee void for a reason outside its events; the mark is kept for good.

        For what breaks the guarantee without changing the mechanism's
        events: reproducible noise (every draw is a public function of the
        seed, so all later noise is public too, even after a resume without
        the seed), fixed-size shuffled batches. ε stays computable (the
        guarantee the events would give with secret randomness), but the run
        is not private: :attr:`void_reasons` lists why, and it survives
        :meth:`to_json` / :meth:`from_json` and so every resume.

        >>> ledger = PrivacyLedger()
        >>> ledger.record_void("reproducible noise (noise_seed=0)")
        >>> PrivacyLedger.from_json(ledger.to_json()).void_reasons
        ('reproducible noise (noise_seed=0)',)
        """
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError(f"reason={reason!r} is invalid: give a non-empty explanation of why the run is void")
        if reason not in self._void:
            self._void.append(reason)

    def record_truncation(self, probability: float, num_steps: int = 1) -> None:
        """Records `num_steps` fixed-size steps, each truncating with `probability` (at N + 1 examples).

        Adds ``probability * num_steps`` to :attr:`truncation_mass`; ε then
        holds for the truncated batches (`epsilon_with_truncation`). The
        steps themselves are recorded with `record_step` as usual.

        >>> ledger = PrivacyLedger()
        >>> ledger.record_truncation(1e-12, num_steps=800)
        >>> ledger.truncation_mass
        8e-10
        """
        if (not _is_real(probability) or not math.isfinite(probability)
                or not 0.0 <= probability <= 1.0):
            raise ValueError(
                f"probability={probability!r} is invalid: it must be a "
                "probability in [0, 1] (of a step's Poisson draw exceeding "
                "the fixed batch size)")
        num_steps = _validate_int("num_steps", num_steps, 0)
        if probability == 0.0 or num_steps == 0:
            return
        self._cache.clear()
        self._truncation_mass += float(probability) * num_steps

    @property
    def truncation_mass(self) -> float:
        """Σ over steps of the truncation probabilities (0.0 without `record_truncation`)."""
        return self._truncation_mass

    @property
    def void_reasons(self) -> tuple[str, ...]:
        """Reasons given to :meth:`record_void`, oldest first (empty for a run that never used one)."""
        return tuple(self._void)

    def _record(self, event: dp_accounting.DpEvent, count: int,
                reason: Optional[str]) -> None:
        if not isinstance(event, dp_accounting.DpEvent):
            raise TypeError(
                f"event={event!r} is invalid: expected a dp_accounting.DpEvent")
        count = _validate_int("count", count, 0)
        while isinstance(event, dp_accounting.SelfComposedDpEvent):
            count *= _validate_int("SelfComposedDpEvent.count", event.count, 0)
            event = event.event
        if reason is None and _contains(event, dp_accounting.NonPrivateDpEvent):
            reason = "a recorded event contains NonPrivateDpEvent"
        if count == 0 or isinstance(event, dp_accounting.NoOpDpEvent):
            return
        event_to_dict(event)  # Fail early on types the ledger cannot persist.
        self._cache.clear()
        last = self._entries[-1] if self._entries else None
        if last is not None and last[2] == reason and last[0] == event:
            last[1] += count
        else:
            self._entries.append([event, count, reason])

    # -- queries ------------------------------------------------------------

    @property
    def steps(self) -> int:
        """Number of training steps recorded with `record_step`."""
        return self._steps

    @property
    def entries(self) -> tuple[tuple[dp_accounting.DpEvent, int], ...]:
        """The merged history as `(event, count)` pairs, oldest first."""
        return tuple((e, c) for e, c, _ in self._entries)

    @property
    def not_private_reasons(self) -> tuple[str, ...]:
        """Distinct reasons given to `record_not_private`, in order."""
        reasons: list[str] = []
        for _, _, reason in self._entries:
            if reason is not None and reason not in reasons:
                reasons.append(reason)
        return tuple(reasons)

    @property
    def is_private(self) -> bool:
        """False once a non-private step has been recorded."""
        return not self.not_private_reasons

    def composed_event(self) -> dp_accounting.ComposedDpEvent:
        """`ComposedDpEvent` of one `SelfComposedDpEvent` per entry."""
        return dp_accounting.ComposedDpEvent(
            [dp_accounting.SelfComposedDpEvent(e, c) for e, c, _ in
             self._entries])

    def epsilon(self, delta: float, accountant: str = "pld") -> float:
        """ε spent so far at `delta`; raises PrivacyNotAvailable if non-DP.

        With a truncation mass, ε holds at `delta` including the share
        `truncation_delta_share` (ValueError when that share would reach δ).
        """
        return self._epsilon_and_share(delta, accountant)[0]

    def truncation_delta_share(self, delta: float,
                               accountant: str = "pld") -> float:
        """The part of `delta` that `epsilon(delta)` leaves to truncated batches: (1 + e^ε)·mass."""
        return self._epsilon_and_share(delta, accountant)[1]

    def _epsilon_and_share(self, delta: float,
                           accountant: str) -> tuple[float, float]:
        delta = validate_delta(delta)
        _validate_accountant(accountant)
        if not self.is_private:
            raise PrivacyNotAvailable(self.not_private_reasons)
        key = (delta, accountant)
        if key not in self._cache:
            self._cache[key] = epsilon_with_truncation(
                lambda d: self._untruncated_epsilon(d, accountant), delta,
                self._truncation_mass)
        return self._cache[key]

    def _untruncated_epsilon(self, delta: float, accountant: str) -> float:
        if not self._entries:
            return 0.0
        return epsilon_from_event(self.composed_event(), delta, accountant)

    def epsilon_if(self, next_event: dp_accounting.DpEvent, count: int,
                   delta: float, accountant: str = "pld") -> float:
        """ε the run would have after recording `next_event` `count` times.

        The ledger itself is not modified.
        """
        trial = self.copy()
        trial.record(next_event, count)
        return trial.epsilon(delta, accountant)

    def copy(self) -> "PrivacyLedger":
        """An independent copy (events are immutable and shared)."""
        other = PrivacyLedger()
        other._entries = [list(e) for e in self._entries]
        other._steps = self._steps
        other._void = list(self._void)
        other._unit = self._unit
        other._truncation_mass = self._truncation_mass
        return other

    # -- the privacy unit ------------------------------------------------------

    @property
    def privacy_unit(self) -> str:
        """What one neighbouring data set differs in: ``"example"`` (default) or ``"user"``."""
        return self._unit

    def set_privacy_unit(self, unit: str) -> None:
        """Records the unit of the guarantee; a ledger that holds steps never changes unit.

        One ledger composes events of one unit only: an example-level ε and a
        user-level ε do not add up to either.

        >>> ledger = PrivacyLedger()
        >>> ledger.set_privacy_unit("user"); ledger.privacy_unit
        'user'
        """
        if unit not in ("example", "user"):
            raise ValueError(f"privacy unit must be 'example' or 'user', got {unit!r}")
        if unit != self._unit and self._entries:
            raise ValueError(f"this ledger holds a {self._unit}-level run ({self._steps} steps); resuming it at the "
                             f"{unit} level would mix two guarantees: start a new run")
        self._unit = unit

    # -- persistence --------------------------------------------------------

    def to_json(self) -> str:
        """Serialises the ledger (exactly) to a JSON string."""
        entries = []
        for event, count, reason in self._entries:
            item: dict[str, Any] = {"event": event_to_dict(event),
                                    "count": count}
            if reason is not None:
                item["not_private_reason"] = reason
            entries.append(item)
        return json.dumps({"format": _LEDGER_FORMAT,
                           "version": _LEDGER_VERSION,
                           "steps": self._steps,
                           "void_reasons": list(self._void),
                           "privacy_unit": self._unit,
                           "truncation_mass": self._truncation_mass,
                           "entries": entries}, sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> "PrivacyLedger":
        """Inverse of `to_json`; raises ValueError on malformed input."""
        try:
            data = json.loads(s)
        except (TypeError, json.JSONDecodeError) as err:
            raise ValueError(f"privacy ledger JSON is malformed: {err}") from None
        if (not isinstance(data, dict) or data.get("format") != _LEDGER_FORMAT):
            raise ValueError(
                f"not a serialised PrivacyLedger (expected format "
                f"{_LEDGER_FORMAT!r})")
        if data.get("version") not in _READABLE_VERSIONS:
            raise ValueError(
                f"PrivacyLedger version {data.get('version')!r} is not "
                f"supported (this reader knows {_READABLE_VERSIONS})")
        ledger = cls()
        ledger._steps = _validate_int("steps", data.get("steps"), 0)
        void = data.get("void_reasons", [])
        if not isinstance(void, list) or not all(isinstance(r, str) and r.strip() for r in void):
            raise ValueError(f"void_reasons={void!r} must be a list of non-empty strings")
        ledger._void = list(void)
        unit = data.get("privacy_unit", _DEFAULT_UNIT)
        if unit not in ("example", "user"):
            raise ValueError(f"privacy_unit={unit!r} must be 'example' or 'user'")
        ledger._unit = unit
        mass = data.get("truncation_mass", 0.0)
        if not _is_real(mass) or not math.isfinite(mass) or mass < 0:
            raise ValueError(f"truncation_mass={mass!r} must be a finite number >= 0")
        ledger._truncation_mass = float(mass)
        for item in data.get("entries", []):
            event = event_from_dict(item.get("event"))
            count = _validate_int("count", item.get("count"), 1)
            reason = item.get("not_private_reason")
            if reason is not None and not isinstance(reason, str):
                raise ValueError(f"not_private_reason={reason!r} must be a str")
            ledger._entries.append([event, count, reason])
        return ledger

    def __repr__(self) -> str:
        return (f"PrivacyLedger(steps={self._steps}, "
                f"entries={self.entries!r}, "
                f"not_private_reasons={self.not_private_reasons!r}, "
                f"void_reasons={self.void_reasons!r}, privacy_unit={self._unit!r}, "
                f"truncation_mass={self._truncation_mass!r})")
