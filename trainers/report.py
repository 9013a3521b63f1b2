"""Prints a comparison table of trainers' JSON metrics files.

Example::

    python -m trainers.report out/demo/sgd.json out/demo/private.json
"""

from __future__ import annotations

import json
import sys

COLUMNS = (
    ("algorithm", "algorithm"),
    ("auc", "AUC"),
    ("bayes_optimal_auc", "optimum AUC"),
    ("private", "private"),
    ("privacy_unit", "unit"),
    ("max_examples_per_user", "k/user"),
    ("epsilon", "epsilon"),
    ("delta", "delta"),
    ("noise_multiplier", "sigma"),
    ("steps", "steps"),
    ("step_ms", "step ms"),
    ("examples_per_sec", "examples/s"),
    ("gradient_size_reduction", "grad. size reduction"),
    ("dense_dpsgd_step_ms", "dense DP-SGD step ms"),
)


def _cell(row: dict, key: str) -> str:
    value = row.get(key)
    if key == "epsilon" and value is None:
        return "n/a"
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _gap_to_nonprivate(rows: list[dict]) -> list[str]:
    """``"lazydp: AUC 0.7012, 0.0403 below non-private (0.7415)"`` for each other row, when a non-private
    reference row exists (one that clips nothing: ``"l2_norm_clip": null``, read from the line, not the name)."""
    reference = next((r for r in rows if "l2_norm_clip" in r and r["l2_norm_clip"] is None
                      and r.get("auc") is not None), None)
    if reference is None:
        return []
    return [f"{r['algorithm']}: AUC {r['auc']:.4f}, {reference['auc'] - r['auc']:.4f} below non-private "
            f"({reference['auc']:.4f})" for r in rows if r is not reference and r.get("auc") is not None]


def format_table(rows: list[dict]) -> str:
    """A plain-text table, one row per run, then notes (why epsilon is n/a, budget stops).

    Columns absent from every row are left out; a missing epsilon prints
    ``n/a`` (never a number), other missing values ``-``.
    """
    keys = [(k, h) for k, h in COLUMNS if any(k in r for r in rows)]
    cells = [[h for _, h in keys]] + [[_cell(r, k) for k, _ in keys] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(keys))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [f"{r['algorithm']}: {r['epsilon_note']}" for r in rows if r.get("epsilon_note")]
    notes += [f"{r['algorithm']}: not private: {reason}" for r in rows for reason in r.get("not_private_reasons", [])
              if reason != r.get("epsilon_note", "").removeprefix("not available: ")]
    notes += [f"{r['algorithm']}: outside the guarantee: {item}" for r in rows for item in r.get("outside_guarantee", [])]
    notes += _gap_to_nonprivate(rows)
    notes += [f"{r['algorithm']}: {r['stop_reason']}" for r in rows
              if str(r.get("stop_reason", "")).startswith("privacy budget")]
    return "\n".join(lines + ([""] + notes if notes else []))


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m trainers.report METRICS.json [...]", file=sys.stderr)
        return 2
    rows = []
    for path in argv[1:]:
        with open(path) as f:
            rows.append(json.loads(f.readline()))
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
