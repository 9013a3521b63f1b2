"""Recall@10 of the dual encoder at 10^5 users by unit, k and users per step, from the JSON lines in docs/results.

Draws ``docs/results/user_level_dual_encoder_100k_lr5.png`` from the runs at
learning rate 5 (issue 20): the example level (5,120 examples per step) and
the user level with k = 1, 5, 20 at 5,120 examples per step (5,120, 1,024 and
256 users) and k = 5 at 5,120 users per step.

Example::

    python -m experiments.user_level_dual_encoder_100k_plot                  # writes the PNG above
    python -m experiments.user_level_dual_encoder_100k_plot --output=/tmp/p.png
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable, Optional, Sequence

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "results")
EXAMPLE = "example level, 5,120 examples/step"


def _users_per_step(line: dict) -> str:
    k = line["max_examples_per_user"]
    return f"user k={k}, {line['examples_per_step'] // k:,} users/step"


#: ``(file, series name of a line or None to leave it out)``.
SOURCES: tuple[tuple[str, Callable[[dict], Optional[str]]], ...] = (
    ("user_level_dual_encoder_100k_lr5.jsonl",
     lambda d: EXAMPLE if d["privacy_unit"] == "example" else "user k=5, 1,024 users/step"),
    ("user_level_dual_encoder_100k_repeats.jsonl",
     lambda d: EXAMPLE if "lr=5.0" in (d.get("diag") or "") and d["privacy_unit"] == "example" else None),
    ("user_level_dual_encoder_100k_lr5_k5_repeat.jsonl", _users_per_step),
    ("user_level_dual_encoder_100k_lr5_k1_k20.jsonl", _users_per_step),
    ("user_level_dual_encoder_100k_lr5_more_users.jsonl", _users_per_step),
)


def series(results: str = RESULTS) -> dict[str, list[tuple[float, float]]]:
    """``{series name: sorted [(target ε, Recall@10)]}`` of the runs in ``SOURCES``."""
    out: dict[str, list] = {}
    for path, name_of in SOURCES:
        with open(os.path.join(results, path)) as f:
            for text in f:
                line = json.loads(text)
                name = name_of(line)
                if name is not None:
                    out.setdefault(name, []).append((line["target_epsilon"], line["recall@10"]))
    return {name: sorted(points) for name, points in out.items()}


def plot(points: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for name, pts in sorted(points.items()):
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", linestyle="--" if name == EXAMPLE else "-",
                label=name)
    ax.axhline(10 / 2000, color="grey", linestyle=":", label="chance (10 / 2,000 movies)")
    ax.set(xlabel="target epsilon (of the run's unit)", ylabel="Recall@10 (held-out users)", xscale="log",
           title="dual encoder, 10^5 synthetic users, 300 steps, learning rate 5")
    ax.set_xticks([1, 4, 8])
    ax.set_xticklabels(["1", "4", "8"])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output", default=os.path.join(RESULTS, "user_level_dual_encoder_100k_lr5.png"))
    a = p.parse_args(argv)
    plot(series(), a.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
