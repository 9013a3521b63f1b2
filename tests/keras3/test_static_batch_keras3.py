"""Fixed-shape batches under Keras 3: the tests of :mod:`tests.test_static_batch` that train, run under Keras 3.

The XLA trace count is read from tf-keras' ``train_function`` (a ``tf.function``); Keras 3 wraps its own.
"""

from tests.test_static_batch import (  # noqa: F401  (collected here, run under Keras 3)
    test_bad_static_settings_are_refused, test_padded_slots_change_nothing,
    test_truncation_probability_and_delta_share_match_an_independent_computation)
from tests.test_static_batch_users import test_user_level_padded_slots_change_nothing  # noqa: F401
