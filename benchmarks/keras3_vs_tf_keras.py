r"""Step time of each mechanism under Keras 3 against tf-keras: same model, same run (issue 21, "Measured").

The legacy switch is per process, so each stack runs in a child process
(``TF_USE_LEGACY_KERAS=1`` / ``0``), started one after the other and
interleaved over ``--repeats`` (tf-keras, Keras 3, tf-keras, Keras 3, ...), so
a change in the machine's load hits both stacks alike. A child builds the
micro model (one :class:`tfdp_sparse.layers.DPEmbedding` table of ``--vocab``
rows and width ``--dim``, Zipf ids, a ``Dense(1)`` logit; one definition for
both stacks), then for every mechanism a :class:`tfdp_sparse.keras.PrivateStep`
around the stack's DP optimizer (``prepare_private``'s choice: ``DPOptimizer``
or ``Keras3DPOptimizer``), warms up (the first step traces) and times
``--steps`` steps, synchronising on the loss after each. Timing noise only:
the noise seed is fixed (``noise_seed``), so these runs are labelled not
private and say so.

Output (``--output``, JSON lines): one line per (stack, repeat, mechanism) with
the median step time, then one ratio line per mechanism,
``keras3_over_tf_keras`` = median over repeats of Keras 3's median step time
divided by tf-keras'. Every line carries ``machine_note`` (the machine is
shared: absolute times are loaded-machine figures; the ratio is the figure).

Example::

    python -m benchmarks.keras3_vs_tf_keras --repeats=2 --steps=20 \
        --output=docs/results/keras3_vs_tf_keras_step_time.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Optional

#: Mechanism -> its knobs; ``sgd`` is the non-private baseline.
MECHANISMS = {
    "sgd": (),
    "dpsgd": (),
    "eana": (),
    "adafest": (("tau", 5.0), ("sigma1", 2.0)),  # false positives: Psi(2.5) ~ 0.6% of the rows
    "dpfest": (("k", 1000),),
    "lazydp": (),  # deferred noise: catch-up of the rows a step reads (the micro model's table is a DPEmbedding)
}
STACK_ENV = {"tf_keras": "1", "keras3": "0"}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _child(vocab: int, dim: int, batch: int, steps: int) -> list[dict]:
    """Runs in a child process: the step time of every mechanism on this process's stack."""
    import numpy as np
    import tensorflow as tf

    from tfdp_sparse.config import PrivacyConfig
    from tfdp_sparse.keras import PrivateStep
    from tfdp_sparse.keras.private_setup import SetupOptions, prepare_private
    from tfdp_sparse.keras_stack import stack_name
    from tfdp_sparse.layers import DPEmbedding
    from trainers.lib.privacy import run_shape
    from trainers.lib.config import LoopConfig

    rng = np.random.default_rng(0)
    ids = (rng.zipf(1.2, batch) % vocab).astype(np.int64)
    labels = rng.integers(0, 2, batch).astype(np.float32)
    lines = []
    for algorithm, extra in MECHANISMS.items():
        inputs = tf.keras.Input((), dtype=tf.int64)
        model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(DPEmbedding(vocab, dim, name="table")(inputs)))
        model(ids[:2])
        if algorithm == "dpfest":
            extra = (("k", 1000), ("kept_ids", (tuple(range(1000)),)))
        privacy = PrivacyConfig(algorithm=algorithm, noise_multiplier=1.0, l2_norm_clip=1.0, extra=extra)
        loop = LoopConfig(batch_size=batch, steps=steps, learning_rate=0.1, noise_seed=1)
        setup = prepare_private(model, privacy, run_shape(loop, 10 * batch), SetupOptions(noise_seed=1))

        def loss(y, logits):
            return tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=tf.reshape(logits, [-1]))

        step = PrivateStep(model, loss, setup.optimizer)
        for _ in range(3):
            float(step(ids, labels)["loss"])
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            float(step(ids, labels)["loss"])
            times.append(1000 * (time.perf_counter() - start))
        lines.append({"stack": stack_name(), "algorithm": algorithm, "step_ms": round(float(np.median(times)), 3),
                      "steps": steps, "vocab": vocab, "dim": dim, "batch": batch})
    return lines


def _run_stack(stack: str, args: argparse.Namespace) -> list[dict]:
    env = dict(os.environ, TF_USE_LEGACY_KERAS=STACK_ENV[stack], TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "benchmarks.keras3_vs_tf_keras", "--child", f"--vocab={args.vocab}",
           f"--dim={args.dim}", f"--batch={args.batch}", f"--steps={args.steps}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{stack} child failed: {proc.stderr[-2000:]}")
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if {line["stack"] for line in lines} != {stack}:
        raise RuntimeError(f"the {stack} child ran {sorted({line['stack'] for line in lines})}")
    return lines


def ratios(lines: list[dict]) -> list[dict]:
    """Per mechanism: median over repeats of (Keras 3 median / tf-keras median), paired by repeat.

    >>> ratios([{"stack": "tf_keras", "repeat": 0, "algorithm": "sgd", "step_ms": 2.0},
    ...         {"stack": "keras3", "repeat": 0, "algorithm": "sgd", "step_ms": 3.0}])[0]["keras3_over_tf_keras"]
    1.5
    """
    import statistics

    out = []
    for algorithm in dict.fromkeys(line["algorithm"] for line in lines):
        by = {(l["stack"], l["repeat"]): l["step_ms"] for l in lines if l["algorithm"] == algorithm}
        repeats = sorted({r for _, r in by})
        paired = [by[("keras3", r)] / by[("tf_keras", r)] for r in repeats
                  if ("keras3", r) in by and ("tf_keras", r) in by]
        out.append({"ratio": "keras3_over_tf_keras", "algorithm": algorithm,
                    "keras3_over_tf_keras": round(statistics.median(paired), 3),
                    "per_repeat": [round(p, 3) for p in paired]})
    return out


def main(argv: Optional[list] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--vocab", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--machine_note", default="shared 2-core machine, other jobs running: absolute times are "
                        "loaded-machine figures, the interleaved ratio is the figure")
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    if args.child:
        for line in _child(args.vocab, args.dim, args.batch, args.steps):
            print(json.dumps(line), flush=True)
        return
    lines = []
    for repeat in range(args.repeats):
        for stack in ("tf_keras", "keras3"):
            lines += [{**line, "repeat": repeat} for line in _run_stack(stack, args)]
    out = [{**line, "machine_note": args.machine_note} for line in lines + ratios(lines)]
    text = "".join(json.dumps(line) + "\n" for line in out)
    print(text, end="")
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
