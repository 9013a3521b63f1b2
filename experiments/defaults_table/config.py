"""What the defaults table runs: the ε grid, the models, their metrics and labels, and the data sizes."""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

EPSILONS = (1.0, 4.0, 8.0)
#: The diagnostic run: DP-SGD's clipping at the default C with σ = 0 (no privacy), at the planner's B and T.
CLIPPED = "clipped"
MODELS = ("pctr", "dlrm", "dual_encoder_example", "dual_encoder_user", "retrieval")
#: The repository (this file is experiments/defaults_table/config.py).
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RETRIEVAL_EXAMPLE = os.path.join(REPO, "examples", "private_retrieval.py")
#: The DLRM-style model's tables: 40,000 rows in all.
DLRM_TABLES = (12_000, 10_000, 8_000, 5_000, 3_000, 2_000)
DLRM_DIM = 16
METRIC = {"pctr": "auc", "dlrm": "auc", "dual_encoder_example": "recall@10", "dual_encoder_user": "recall@10",
          "retrieval": "recall@10"}
LABELS = {"pctr": "pCTR model (models/pctr.py)", "dlrm": "DLRM-style model (6 tables, dot interactions)",
          "dual_encoder_example": "dual encoder, example level", "dual_encoder_user": "dual encoder, user level",
          "retrieval": "retrieval example (examples/private_retrieval.py)"}


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Data and model sizes of one grid (the full grid or ``--smoke``)."""

    pctr_examples: int = 50_000
    pctr_eval: int = 20_000
    pctr_vocab_scale: float = 0.05
    pctr_hidden: str = "64"
    dlrm_examples: int = 50_000
    dlrm_eval: int = 20_000
    dlrm_tables: tuple = DLRM_TABLES
    de_users: int = 5_000
    de_movies: int = 1_000
    de_examples: int = 20_000
    de_eval: int = 5_000
    de_k: int = 5
    epochs: Optional[float] = None  # the planner's compute budget (None: its default, 10 epochs)

    def describe(self, model: str) -> str:
        if model == "pctr":
            return (f"synthetic Criteo-like, N={self.pctr_examples:,} train / {self.pctr_eval:,} test, "
                    f"vocab_scale={self.pctr_vocab_scale:g}, hidden={self.pctr_hidden}")
        if model == "dlrm":
            return (f"synthetic Criteo-like with 6 categorical features, tables {'+'.join(map(str, self.dlrm_tables))}"
                    f" = {sum(self.dlrm_tables):,} rows × {DLRM_DIM}, N={self.dlrm_examples:,} train / "
                    f"{self.dlrm_eval:,} test")
        if model == "retrieval":
            return ("the example's own data, model and settings (its defaults: full-catalogue softmax, DP-SGD, "
                    "see examples/private_retrieval.py); its non-private reference is its own (the same model, "
                    "Adam, no clipping or noise), run once per seed")
        unit = f", user level k={self.de_k}" if model.endswith("user") else ""
        return (f"synthetic MovieLens-like, {self.de_users:,} users (80% train), {self.de_movies:,} movies "
                f"(chance recall@10 = {10 / self.de_movies:.3f}), {self.de_examples:,} train examples{unit}")


#: ``--smoke``: tiny data. The planner keeps at least 500 steps and needs 10 epochs of at least 800 units
#: (users at the user level) for its smallest batch of 16, hence 1,000 users.
SMOKE = Sizes(pctr_examples=800, pctr_eval=300, pctr_vocab_scale=0.01, pctr_hidden="8", dlrm_examples=800,
              dlrm_eval=300, dlrm_tables=(60, 50, 40, 30, 20, 10), de_users=1_000, de_movies=50, de_examples=1_000,
              de_eval=200, de_k=3, epochs=10)
