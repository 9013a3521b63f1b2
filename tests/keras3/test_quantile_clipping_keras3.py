"""Adaptive clipping on Keras 3 (issue 34 item 2): the same step core as tf-keras, so the bound moves and ε is the
joint Gaussian's at both units. The tf-keras twin (tests/test_quantile_clipping.py) also pins the accounting, the
sensitivity, the noise laws and LazyDP's catch-up under a moving bound."""
from __future__ import annotations

import pytest

from tests.test_quantile_clipping import check_adaptive_fit, fit_adaptive


@pytest.mark.parametrize("unit", ["example", "user"])
def test_fit_moves_the_bound_and_charges_the_count_on_keras3(unit):
    from tests.test_make_private_users import N, USERS
    check_adaptive_fit(fit_adaptive(unit), 8 / (USERS if unit == "user" else N))
