r"""What calibrating σ to a target ε costs, before and after issue 32 item 2 (setup cost).

``make_private(model, PrivacyConfig(target_epsilon=...))`` calibrates σ before
the first step (:func:`tfdp_sparse.accounting.calibrate_sigma`, PLD by default).
This benchmark times that search, in a fresh state each time (the process
memos of ε and of one-step PLDs cleared), for the search of this version
(``new``) and the search before it (``old``: RDP bracket, RDP Brent, the
adaptive PLD at the RDP answer, 0.75 steps down, Brent on that PLD grid;
kept below as :func:`legacy_calibrate` for the comparison), **alternated**
(old, new, new, old, ...) on a shared machine. It counts what the accountant
computed (deterministic, unlike the seconds):

* ``pld_builds`` — one-step PLDs built (``from_gaussian_mechanism``: the
  expensive part, 0.01-0.7 s each depending on the grid), and ``pld_points``
  the points of their PMFs (a build's time is about proportional to them);
* ``pld_epsilons`` / ``rdp_epsilons`` — ε computed by a PLD / RDP accountant
  (each a composition; memo hits are not counted).

Settings (``--settings``): ``make_private_40`` (batch 256 of N = 50,000, 40
steps, the default δ of N: the 6-table setup of the issue), ``demo`` (batch
4096 of N = 200,000, 400 steps: ``configs/demo_private.cfg``), ``q01_T1000``
(q = 0.01, 1000 steps, δ = 1e-6: the calibration doctest), ``user_level``
(a user-level run's shape: 204 of 10,000 users a step, 150 steps, after a
σ-independent Gaussian pre-training release, as ``mechanisms.calibration``
composes it), all at ε = 1 with the PLD accountant. Printed (JSON lines):

* ``{"kind": "calibration", "setting", "sigma_old", "sigma_new", "sigma_rel_change",
  "epsilon_old", "epsilon_new" (epsilon_from_event, the ledger's function), "seconds_old",
  "seconds_new" (medians), "rounds_old" / "rounds_new" (every round), "counts_old" / "counts_new"}``;
* with ``--reference``: ``"sigma_reference"``, the smallest σ (bisection to
  ``1e-4``) with ``epsilon_from_event <= target`` (slow: ~12 ledger evaluations);
* ``{"kind": "end_to_end", "config": "non_private" | "old" | "new", ...}`` (unless
  ``--no_end_to_end``): the 6-table Keras CTR model of
  ``benchmarks.make_private_overhead`` (batch 256 of N = 50,000, 40 steps): seconds
  from ``compile`` (non-private ``model.fit``) or ``make_private`` (DP-SGD, target
  ε = 1, old / new calibration) to the end of the first training step
  (``to_first_step_s``; ``paired_minus_non_private_s``: the median over rounds of
  the difference to the same round's non-private run), alternated round by round
  after one untimed non-private run, and the whole 40-step ``fit`` (``total_s``).

``--smoke`` runs the ``smoke`` setting (q = 1, 3 steps, ε = 4: cheap PLDs) once
and the end-to-end comparison on a 64-example model at q = 1.

Example::

    python -m benchmarks.calibration_cost --reference          # ~6 minutes: docs/results/calibration_cost.jsonl
    python -m benchmarks.calibration_cost --smoke              # seconds (the test runs this)
    python -m benchmarks.calibration_cost --settings=demo --rounds=3 --reference --output=/tmp/c.jsonl
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Callable, Iterator, Optional, Sequence, TextIO  # noqa: E402

import dp_accounting  # noqa: E402
from dp_accounting.pld import pld_privacy_accountant, privacy_loss_distribution  # noqa: E402
from dp_accounting.rdp import rdp_privacy_accountant  # noqa: E402

from tfdp_sparse.accounting import calibration, epsilon as epsilon_module, pld_memo  # noqa: E402
from tfdp_sparse.accounting.memo import ACCOUNTANT_MEMO  # noqa: E402
from tfdp_sparse.accounting.validation import default_delta  # noqa: E402

EventOf = Callable[[float], dp_accounting.DpEvent]


@dataclasses.dataclass(frozen=True)
class Setting:
    """One calibration: ``steps`` DP-SGD steps at Poisson rate ``q`` (after ``release``, if any), (ε, δ)."""

    name: str
    q: float
    steps: int
    delta: float
    target_epsilon: float = 1.0
    #: σ of a σ-independent Gaussian pre-training release composed first (``None``: none).
    release: Optional[float] = None

    def event_of(self) -> EventOf:
        """σ -> the run's event, composed as ``tfdp_sparse.mechanisms.calibration.calibrate`` does."""
        return run_event(self.q, self.steps, self.release)


def run_event(q: float, steps: int, release: Optional[float] = None) -> EventOf:
    """σ -> ``steps`` Poisson-subsampled Gaussian steps at rate ``q`` after an optional one-off Gaussian release.

    Composed as ``tfdp_sparse.mechanisms.calibration.calibrate`` composes a run. Example:
    ``run_event(0.01, 1000)(1.0)`` is ``Composed([SelfComposed(PoissonSampled(0.01, Gaussian(1.0)), 1000)])``.
    """

    def run(sigma: float) -> dp_accounting.DpEvent:
        step = dp_accounting.GaussianDpEvent(sigma)
        if q < 1.0:
            step = dp_accounting.PoissonSampledDpEvent(q, step)
        one_off = [] if release is None else [
            dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(release), 1)]
        return dp_accounting.ComposedDpEvent(one_off + [dp_accounting.SelfComposedDpEvent(step, steps)])

    return run


SETTINGS = {
    s.name: s for s in (
        Setting("make_private_40", 256 / 50_000, 40, default_delta(50_000)),
        Setting("demo", 4096 / 200_000, 400, default_delta(200_000)),
        Setting("q01_T1000", 0.01, 1000, 1e-6),
        Setting("user_level", 204 / 10_000, 150, default_delta(10_000), release=10.0),
        # --smoke: cheap PLDs (q = 1: the plain Gaussian mechanism, few steps).
        Setting("smoke", 1.0, 3, 1e-5, target_epsilon=4.0),
    )
}
DEFAULT_SETTINGS = ("make_private_40", "demo", "q01_T1000", "user_level")


# -- the search before issue 32 item 2 (for the paired comparison) ---------------------------------

def legacy_calibrate(event_of: EventOf, target_epsilon: float, delta: float, accountant: str,
                     tolerance: float) -> float:
    """``calibration._calibrate`` as it was: RDP bracket and Brent, then PLD (adaptive grid at the
    RDP answer, 0.75 steps down, Brent on that grid), then the check with ``epsilon_from_event``."""
    lo, hi = calibration._rdp_bracket(event_of, target_epsilon, delta)
    if lo == 0.0:
        return hi
    sigma = float(dp_accounting.calibrate_dp_mechanism(
        lambda: rdp_privacy_accountant.RdpAccountant(orders=list(epsilon_module.RDP_ORDERS)),
        event_of, target_epsilon, delta, dp_accounting.ExplicitBracketInterval(lo, hi), tol=tolerance))
    if accountant != "rdp":
        upper = sigma + tolerance
        _, interval = epsilon_module._adaptive_pld(event_of(upper), delta)
        lower = 0.75 * upper
        for _ in range(100):
            if epsilon_module._pld_epsilon(event_of(lower), delta, interval) > target_epsilon:
                break
            upper, lower = lower, 0.75 * lower
        sigma = float(dp_accounting.calibrate_dp_mechanism(
            lambda: pld_memo.MemoPLDAccountant(value_discretization_interval=interval),
            event_of, target_epsilon, delta, dp_accounting.ExplicitBracketInterval(lower, upper), tol=tolerance))
    for _ in range(1000):
        if epsilon_module.epsilon_from_event(event_of(sigma), delta, accountant) <= target_epsilon:
            return sigma
        sigma += tolerance
    raise RuntimeError("calibration failed to meet target_epsilon")


@contextlib.contextmanager
def search(which: str) -> Iterator[None]:
    """``calibrate_sigma`` with this version's search (``new``) or :func:`legacy_calibrate` (``old``)."""
    if which not in ("old", "new"):
        raise ValueError(f"search={which!r} must be 'old' or 'new'")
    saved = calibration._calibrate
    if which == "old":
        calibration._calibrate = legacy_calibrate
    try:
        yield
    finally:
        calibration._calibrate = saved


def fresh_state() -> None:
    """Forgets every memoised ε, σ and one-step PLD of the process."""
    ACCOUNTANT_MEMO.clear()
    pld_memo._STEP_PLDS.clear()


@contextlib.contextmanager
def counting() -> Iterator[dict]:
    """Counts PLD builds and PLD / RDP ε computations inside the block (dp_accounting's entry points)."""
    counts = {"pld_builds": 0, "pld_points": 0, "pld_epsilons": 0, "rdp_epsilons": 0}
    build = privacy_loss_distribution.from_gaussian_mechanism
    pld_eps = pld_privacy_accountant.PLDAccountant.get_epsilon
    rdp_eps = rdp_privacy_accountant.RdpAccountant.get_epsilon

    def counted(name: str, fn: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    def built(*args, **kwargs):
        pld = counted("pld_builds", build)(*args, **kwargs)
        counts["pld_points"] += _pmf_size(pld._pmf_remove) + (0 if pld._symmetric else _pmf_size(pld._pmf_add))
        return pld

    privacy_loss_distribution.from_gaussian_mechanism = built
    pld_privacy_accountant.PLDAccountant.get_epsilon = counted("pld_epsilons", pld_eps)
    rdp_privacy_accountant.RdpAccountant.get_epsilon = counted("rdp_epsilons", rdp_eps)
    try:
        yield counts
    finally:
        privacy_loss_distribution.from_gaussian_mechanism = build
        pld_privacy_accountant.PLDAccountant.get_epsilon = pld_eps
        rdp_privacy_accountant.RdpAccountant.get_epsilon = rdp_eps


def _pmf_size(pmf) -> int:
    """Points of a one-step PLD's PMF (a build's cost is about proportional to them)."""
    return int(getattr(pmf, "size", 0))


def timed_calibration(setting: Setting, which: str, accountant: str = "pld") -> dict:
    """One calibration in a fresh state: σ, seconds, counts, and ε of σ with the ledger's function."""
    event_of = setting.event_of()
    fresh_state()
    with search(which), counting() as counts:
        t0 = time.perf_counter()
        sigma = calibration.calibrate_sigma(event_of, setting.target_epsilon, setting.delta, accountant)
        seconds = time.perf_counter() - t0
    eps = epsilon_module.epsilon_from_event(event_of(sigma), setting.delta, accountant)
    return {"sigma": sigma, "seconds": seconds, "counts": dict(counts), "epsilon": eps}


def reference_sigma(setting: Setting, start: float, width: float = 1e-4) -> float:
    """Smallest σ, to ``width``, with ``epsilon_from_event(event(σ)) <= target`` (bisection; slow).

    The bracket grows geometrically from ``start`` (e.g. the calibrated σ) until it holds.
    """
    event_of, target = setting.event_of(), setting.target_epsilon

    def meets(sigma: float) -> bool:
        return epsilon_module.epsilon_from_event(event_of(sigma), setting.delta) <= target

    lo, hi = 0.98 * start, start
    while meets(lo):
        lo *= 0.98
    while not meets(hi):
        hi *= 1.02
    while hi - lo > width:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if meets(mid) else (mid, hi)
    return hi


def calibration_line(setting: Setting, rounds: int, reference: bool) -> dict:
    """Old and new alternated ``rounds`` times each (old, new, new, old, ...): one JSON record."""
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    for r in range(rounds):
        for which in (("old", "new") if r % 2 == 0 else ("new", "old")):
            runs[which].append(timed_calibration(setting, which))
    old, new = runs["old"][0], runs["new"][0]
    for which in ("old", "new"):  # deterministic: every round finds the same σ with the same work
        assert all(r["sigma"] == runs[which][0]["sigma"] and r["counts"] == runs[which][0]["counts"]
                   for r in runs[which]), which
    line = {
        "benchmark": "calibration_cost", "kind": "calibration", "setting": setting.name,
        "q": setting.q, "steps": setting.steps, "delta": setting.delta, "target_epsilon": setting.target_epsilon,
        "release_sigma": setting.release, "accountant": "pld",
        "sigma_old": old["sigma"], "sigma_new": new["sigma"],
        "sigma_rel_change": new["sigma"] / old["sigma"] - 1.0,
        "epsilon_old": old["epsilon"], "epsilon_new": new["epsilon"],
        "seconds_old": round(statistics.median(r["seconds"] for r in runs["old"]), 3),
        "seconds_new": round(statistics.median(r["seconds"] for r in runs["new"]), 3),
        "rounds_old": [round(r["seconds"], 3) for r in runs["old"]],
        "rounds_new": [round(r["seconds"], 3) for r in runs["new"]],
        "counts_old": old["counts"], "counts_new": new["counts"],
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    if reference:
        fresh_state()
        ref = reference_sigma(setting, new["sigma"])
        line.update(sigma_reference=ref, sigma_old_vs_reference=old["sigma"] / ref - 1.0,
                    sigma_new_vs_reference=new["sigma"] / ref - 1.0)
    return line


# -- end to end: make_private + compile + the first step ---------------------------------------------

@dataclasses.dataclass(frozen=True)
class EndToEnd:
    """The 6-table model of ``benchmarks.make_private_overhead`` trained ``steps`` steps at ``batch``."""

    batch: int = 256
    num_examples: int = 50_000
    steps: int = 40
    target_epsilon: float = 1.0
    rounds: int = 3
    buckets: int = 2_000
    hidden: int = 64
    #: one untimed non-private run first (TensorFlow's one-off start)
    warmup: bool = True

    def smoke(self) -> "EndToEnd":
        # q = 1 (every example in every step): the cheapest PLDs, so the calibrations take a fraction of a second.
        return dataclasses.replace(self, batch=64, num_examples=64, steps=3, target_epsilon=4.0, rounds=1,
                                   buckets=200, hidden=8, warmup=False)


def end_to_end_lines(e: EndToEnd, progress: TextIO) -> list[dict]:
    """Seconds to the end of the first step: non-private, private with old and with new calibration."""
    import numpy as np
    import tensorflow as tf

    from benchmarks import make_private_overhead as overhead
    from tfdp_sparse.config import PrivacyConfig
    from tfdp_sparse.keras import make_private

    s = dataclasses.replace(overhead.Settings(), features=6, buckets=e.buckets, hidden=e.hidden, batch=e.batch,
                            num_examples=e.num_examples, steps=e.steps)
    x, y = overhead.load(s)

    class FirstStep(tf.keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.at: Optional[float] = None

        def on_train_batch_end(self, batch, logs=None) -> None:
            if self.at is None:
                self.at = time.perf_counter()

    def non_private() -> dict:
        model = overhead.build_model(s)
        model({k: v[:2] for k, v in x.items()})
        first = FirstStep()
        n = e.steps * e.batch
        idx = np.random.default_rng(0).choice(e.num_examples, size=n, replace=n > e.num_examples)
        t0 = time.perf_counter()
        model.compile(optimizer=tf.keras.optimizers.SGD(s.learning_rate), loss=overhead.LOSS)
        model.fit({k: v[idx] for k, v in x.items()}, y[idx], batch_size=e.batch, epochs=1, shuffle=False,
                  verbose=0, callbacks=[first])
        return {"to_first_step_s": first.at - t0, "total_s": time.perf_counter() - t0}

    def private(which: str) -> dict:
        model = overhead.build_model(s)
        model({k: v[:2] for k, v in x.items()})
        first = FirstStep()
        fresh_state()
        with search(which), counting() as counts:
            t0 = time.perf_counter()
            wrapped = make_private(model, PrivacyConfig(algorithm="dpsgd", target_epsilon=e.target_epsilon,
                                                        l2_norm_clip=1.0),
                                   num_examples=e.num_examples, batch_size=e.batch, steps=e.steps,
                                   learning_rate=s.learning_rate, loss=overhead.LOSS)
            setup = time.perf_counter() - t0
            wrapped.compile()
            wrapped.fit(x, y, verbose=0, callbacks=[first])
            total = time.perf_counter() - t0
        report = wrapped.report()
        return {"to_first_step_s": first.at - t0, "total_s": total, "make_private_s": setup,
                "sigma": report["noise_multiplier"], "epsilon": report["epsilon"], "counts": dict(counts)}

    runs: dict[str, list[dict]] = {"non_private": [], "old": [], "new": []}
    if e.warmup:
        non_private()  # TensorFlow's one-off start, not reported
    orders = (("non_private", "old", "new"), ("new", "old", "non_private"), ("old", "new", "non_private"))
    for r in range(e.rounds):
        for which in orders[r % len(orders)]:
            runs[which].append(non_private() if which == "non_private" else private(which))
        print(f"end_to_end round {r + 1}/{e.rounds} done", file=progress, flush=True)
    floor = [r["to_first_step_s"] for r in runs["non_private"]]
    lines = []
    for which, rs in runs.items():
        to_first = [r["to_first_step_s"] for r in rs]
        line = {
            "benchmark": "calibration_cost", "kind": "end_to_end", "config": which,
            "to_first_step_s": round(statistics.median(to_first), 3),
            "rounds_to_first_step_s": [round(t, 3) for t in to_first],
            "paired_minus_non_private_s": round(statistics.median(a - b for a, b in zip(to_first, floor)), 3),
            "total_s": round(statistics.median(r["total_s"] for r in rs), 3),
            "batch": e.batch, "num_examples": e.num_examples, "steps": e.steps, "tables": 6,
            "rows_per_table": e.buckets, "load_avg_1m": round(os.getloadavg()[0], 2),
        }
        if which != "non_private":
            line.update(target_epsilon=e.target_epsilon, sigma=rs[0]["sigma"], epsilon=rs[0]["epsilon"],
                        make_private_s=round(statistics.median(r["make_private_s"] for r in rs), 3),
                        counts=rs[0]["counts"])
        lines.append(line)
    return lines


# -- command line ---------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Options:
    settings: tuple = DEFAULT_SETTINGS
    rounds: int = 3
    reference: bool = False
    end_to_end: Optional[EndToEnd] = EndToEnd()


def run(o: Options, out: TextIO = sys.stdout, progress: TextIO = sys.stderr,
        output: Optional[str] = None) -> list[dict]:
    """Every setting's calibration line, then the end-to-end lines; printed and appended to ``output``."""
    lines = []
    sink = open(output, "a") if output else None

    def emit(line: dict) -> None:
        lines.append(line)
        text = json.dumps(line)
        print(text, file=out, flush=True)
        if sink is not None:
            sink.write(text + "\n")
            sink.flush()

    try:
        for name in o.settings:
            emit(calibration_line(SETTINGS[name], o.rounds, o.reference))
            print(f"{name} done", file=progress, flush=True)
        if o.end_to_end is not None:
            for line in end_to_end_lines(o.end_to_end, progress):
                emit(line)
    finally:
        if sink is not None:
            sink.close()
    return lines


def parse(argv: Optional[Sequence[str]] = None) -> tuple[Options, Optional[str]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="the cheap 'smoke' setting and a tiny end-to-end run")
    p.add_argument("--settings", default=None, help=f"comma list of {','.join(SETTINGS)}")
    p.add_argument("--rounds", type=int, default=None, help="alternated rounds (each: old and new once)")
    p.add_argument("--reference", action="store_true", help="also the bisection reference σ (slow)")
    p.add_argument("--no_end_to_end", action="store_true", help="calibrations only")
    p.add_argument("--end_to_end_rounds", type=int, default=EndToEnd.rounds)
    p.add_argument("--output", default=None, help="also append the JSON lines to this file")
    a = p.parse_args(argv)
    names = a.settings.split(",") if a.settings else (["smoke"] if a.smoke else list(DEFAULT_SETTINGS))
    names = [n.strip() for n in names if n.strip()]
    unknown = [n for n in names if n not in SETTINGS]
    if unknown or not names:
        raise ValueError(f"settings={names} must be names from {list(SETTINGS)}")
    rounds = a.rounds if a.rounds is not None else (1 if a.smoke else 3)
    if rounds < 1 or a.end_to_end_rounds < 1:
        raise ValueError("rounds must be >= 1")
    e2e = None if a.no_end_to_end else dataclasses.replace(EndToEnd(), rounds=a.end_to_end_rounds)
    if e2e is not None and a.smoke:
        e2e = e2e.smoke()
    return Options(settings=tuple(names), rounds=rounds, reference=a.reference, end_to_end=e2e), a.output


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        options, output = parse(argv)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    run(options, output=output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
