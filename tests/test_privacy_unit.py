"""The typed privacy-unit setting (issue 20, item 1): example or user with a public cap k."""

import doctest

import pytest
import tensorflow as tf

from tfdp_sparse import privacy_unit
from tfdp_sparse.clipping.user_norms import UserClipMethod, UserClipping, UserSegments
from tfdp_sparse.privacy_unit import PrivacyUnit, PrivacyUnitConfig


def test_docstring_examples():
    assert doctest.testmod(privacy_unit).failed == 0


def test_example_level_is_the_default_and_clips_per_example():
    unit = PrivacyUnitConfig()
    assert unit.unit is PrivacyUnit.EXAMPLE and not unit.is_user_level
    assert unit.clipping(UserSegments(tf.constant([0]), tf.constant(1))) is None
    assert unit.describe() == {"privacy_unit": "example"}


def test_user_level_carries_k_and_the_method_into_clipping():
    unit = PrivacyUnitConfig.user(5, UserClipMethod.EXAMPLE_SHARE)
    segments = UserSegments(tf.constant([0, 1, 0]), tf.constant(2))
    clipping = unit.clipping(segments)
    assert isinstance(clipping, UserClipping)
    assert clipping.method is UserClipMethod.EXAMPLE_SHARE and clipping.max_examples_per_user == 5
    assert PrivacyUnitConfig.user(3).clip_method is UserClipMethod.GROUP_NORM


@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(unit="user"), TypeError, "PrivacyUnit"),
    (dict(unit=PrivacyUnit.USER), ValueError, "max_examples_per_user"),
    (dict(unit=PrivacyUnit.USER, max_examples_per_user=0), ValueError, "max_examples_per_user"),
    (dict(unit=PrivacyUnit.USER, max_examples_per_user=True), ValueError, "max_examples_per_user"),
    (dict(unit=PrivacyUnit.USER, max_examples_per_user=2, clip_method="group_norm"), TypeError, "UserClipMethod"),
    (dict(max_examples_per_user=5), ValueError, "PrivacyUnit.USER only"),
])
def test_bad_settings_refused_by_name(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        PrivacyUnitConfig(**kwargs)
