"""The dual encoder's own precision/recall@k on saved scores, in a tf-keras process (its module is tf-keras only).

``python -m tests.keras3.run_recall IN.npz OUT.json``: IN holds ``scores [N, M]``,
``labels [N]`` and ``ks``; OUT gets :func:`models.dual_encoder.metrics.precision_recall_at_k`.
"""

from __future__ import annotations

import json
import sys

import numpy as np


def main(source: str, target: str) -> None:
    from models.dual_encoder.metrics import precision_recall_at_k  # tf-keras only

    with np.load(source) as f:
        result = precision_recall_at_k(f["scores"], f["labels"], ks=tuple(int(k) for k in f["ks"]))
    with open(target, "w") as out:
        json.dump(result, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
