"""No ε on a run labelled not private, and no users-against-examples batch-size warning, under Keras 3 too.

The tests are those of :mod:`tests.test_fit_labels`, collected again in this process (``tf.keras`` is Keras 3).
"""

from tests.test_fit_labels import (  # noqa: F401  (collected here, run under Keras 3)
    test_a_poisson_run_shows_its_epsilon, test_a_tf_data_run_labelled_not_private_shows_no_epsilon,
    test_the_user_level_batch_size_check_does_not_compare_users_with_examples,
    test_example_weights_are_refused_on_every_path_with_a_message_about_weights)


def test_fit_gives_no_spurious_shuffle_warning(recwarn):
    from tests.test_fit_labels import _data, _private

    _private(epochs=1).fit(*_data(), verbose=0)
    assert not [w for w in recwarn if "shuffle=True" in str(w.message)]
