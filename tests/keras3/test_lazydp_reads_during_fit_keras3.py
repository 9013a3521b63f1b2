"""No callback reads a row that owes deferred noise, and an interrupted fit flushes, under Keras 3 too.

The tests are those of :mod:`tests.test_lazydp_reads_during_fit`, collected again in this process (``tf.keras`` is
Keras 3 here).
"""

from tests.test_lazydp_reads_during_fit import (  # noqa: F401  (collected here, run under Keras 3)
    test_a_batch_callback_sees_every_noised_row_move_not_the_batchs_rows, test_an_interrupted_fit_leaves_no_row_owing_noise,
    test_only_callbacks_that_run_at_batches_make_every_batch_flush,
    test_reading_rows_before_their_noise_is_an_explicit_choice_that_voids_the_label,
    test_saving_weights_from_a_callback_writes_caught_up_rows)
