"""``--keras_stack``: which Keras a trainer runs (tf-keras or Keras 3 on TensorFlow), chosen per process.

TensorFlow resolves ``tf.keras`` once per process, from ``TF_USE_LEGACY_KERAS``
(``1``: tf-keras; ``0``: Keras 3), before any flag is parsed; the trainers
set ``1`` when the variable is unset. So the environment decides, and
``--keras_stack=tf_keras|keras3`` (default: whatever the environment gives)
only asks for one: when it disagrees with the stack this process runs, the
trainer runs itself again as a child process (``python -m MODULE`` with the
same arguments) with ``TF_USE_LEGACY_KERAS`` set for the requested stack, and
exits with the child's status (the child prints the JSON line). If the
variable already asks for the requested stack and the process still runs
the other one (a Keras package missing), it fails naming the variable.

The JSON line's ``keras_stack`` field says which stack ran
(:func:`tfdp_sparse.keras_stack.stack_name`).

Example::

    code = reexec_for_stack(FLAGS.keras_stack, "trainers.train_pctr")   # in main(), before anything else
    if code is not None:
        return code
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Optional

from tfdp_sparse.keras_stack import KERAS_3, TF_KERAS, stack_name

#: The environment variable TensorFlow reads once per process to pick its Keras.
LEGACY_KERAS_ENV = "TF_USE_LEGACY_KERAS"
#: ``--keras_stack`` value -> the variable's value that selects it.
ENV_VALUE = {TF_KERAS: "1", KERAS_3: "0"}
FLAG_HELP = ("Keras stack: tf_keras or keras3 (default: the environment's, TF_USE_LEGACY_KERAS=1 -> tf_keras, 0 -> "
             "keras3; unset -> tf_keras). TensorFlow picks its Keras once per process, so when this flag disagrees "
             "with the environment the trainer runs itself again in a child process with TF_USE_LEGACY_KERAS set "
             "for the requested stack")


def reexec_for_stack(requested: Optional[str], module: str) -> Optional[int]:
    """``None`` when this process runs ``requested`` (or nothing was requested); else the exit code of a child run.

    Raises ``ValueError`` naming ``TF_USE_LEGACY_KERAS`` when the variable already
    asks for ``requested`` but the process runs the other stack (no child then: no loop).
    """
    if requested is None or requested == stack_name():
        return None
    if requested not in ENV_VALUE:
        raise ValueError(f"keras_stack must be one of {sorted(ENV_VALUE)}, got {requested!r}")
    wanted = ENV_VALUE[requested]
    if os.environ.get(LEGACY_KERAS_ENV) == wanted:
        raise ValueError(f"--keras_stack={requested} but this process runs {stack_name()} although "
                         f"{LEGACY_KERAS_ENV}={wanted}: install the missing Keras package (tf-keras for tf_keras, "
                         f"keras>=3 for keras3), and set {LEGACY_KERAS_ENV} before TensorFlow is imported")
    env = dict(os.environ, **{LEGACY_KERAS_ENV: wanted})
    return subprocess.run([sys.executable, "-m", module, *sys.argv[1:]], env=env, check=False).returncode


def refuse_on_keras_3(cluster: str, embedding_backend_value: Optional[str], **more: tuple) -> None:
    """What the Keras 3 stack does not run yet, refused by name before any data is read (on Keras 3 only).

    ``cluster`` (``--cluster``) and ``embedding_backend_value`` (``--embedding_backend`` other than keras, else
    ``None``) are refused for every trainer; ``more`` maps a flag name to ``(value, why)``.
    Example: ``refuse_on_keras_3("local_ps:2,1", None)`` raises on Keras 3 naming ``--cluster``.
    """
    if stack_name() != KERAS_3:
        return
    refused = {
        "--cluster": (cluster, "parameter-server training (ShardedDPOptimizer) is tf-keras only"),
        "--embedding_backend": (embedding_backend_value, "the TPU embedding program is tf-keras only"),
        **{f"--{name}": value for name, value in more.items()},
    }
    for name, (value, why) in refused.items():
        if value:
            raise ValueError(f"{name}={value} is not supported on Keras 3 ({why}); run with --keras_stack=tf_keras "
                             f"(TF_USE_LEGACY_KERAS=1)")

