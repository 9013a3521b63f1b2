"""The privacy unit of a run: one example, or one user with all their examples (issue 20, item 1).

A guarantee is only as good as the unit it protects. At the example level
(the papers' unit) a neighbouring data set differs in one example; at the
user level it differs in one *user*, with everything they contributed
(Charles et al. 2024, "Fine-tuning LLMs with user-level differential
privacy"; Chua et al. 2024, "Mind the privacy unit"). The user level needs
three things together, each built elsewhere in the toolkit:

* sampling of users by Poisson with at most ``k`` (public) examples each
  (:class:`tfdp_sparse.data.user_sampling.UserPoissonSampler`), whose rate
  ``q`` over users is what the accountant uses;
* per-user clipping (:func:`tfdp_sparse.clipping.clip.clip_gradients` with a
  :class:`~tfdp_sparse.clipping.user_norms.UserClipping`);
* the unit and ``k`` in the JSON line and the ledger.

:class:`PrivacyUnitConfig` is the one typed setting that carries the choice
to ``make_private`` and the trainers. It is privacy-relevant (DESIGN §3):
changing it changes the guarantee.

Example::

    >>> unit = PrivacyUnitConfig.user(max_examples_per_user=5)
    >>> unit.describe()
    {'privacy_unit': 'user', 'max_examples_per_user': 5, 'user_clipping': 'group_norm'}
    >>> PrivacyUnitConfig().describe()
    {'privacy_unit': 'example'}
"""

from __future__ import annotations

import dataclasses
import enum
import numbers
from typing import Optional

from tfdp_sparse.clipping.user_norms import UserClipMethod, UserClipping, UserSegments

__all__ = ["PrivacyUnit", "PrivacyUnitConfig"]


class PrivacyUnit(enum.Enum):
    """What a neighbouring data set differs in."""

    EXAMPLE = "example"
    USER = "user"


@dataclasses.dataclass(frozen=True)
class PrivacyUnitConfig:
    """The privacy unit and, at the user level, the public cap ``k`` and the clipping method.

    Attributes:
      unit: :class:`PrivacyUnit`.
      max_examples_per_user: ``k`` (user level only; ``None`` at the example level).
      clip_method: how a user's contribution is bounded by ``C`` (user level only).

    Example: ``PrivacyUnitConfig(PrivacyUnit.USER, 5, UserClipMethod.EXAMPLE_SHARE)``.
    """

    unit: PrivacyUnit = PrivacyUnit.EXAMPLE
    max_examples_per_user: Optional[int] = None
    clip_method: Optional[UserClipMethod] = None

    def __post_init__(self):
        if not isinstance(self.unit, PrivacyUnit):
            raise TypeError(f"unit must be a PrivacyUnit, got {self.unit!r}")
        if self.unit is PrivacyUnit.EXAMPLE:
            if self.max_examples_per_user is not None or self.clip_method is not None:
                raise ValueError("max_examples_per_user and clip_method apply to PrivacyUnit.USER only")
            return
        k = self.max_examples_per_user
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
            raise ValueError(f"PrivacyUnit.USER needs max_examples_per_user, a positive integer, got {k!r}")
        object.__setattr__(self, "max_examples_per_user", int(k))
        if self.clip_method is None:
            object.__setattr__(self, "clip_method", UserClipMethod.GROUP_NORM)
        if not isinstance(self.clip_method, UserClipMethod):
            raise TypeError(f"clip_method must be a UserClipMethod, got {self.clip_method!r}")

    @classmethod
    def user(cls, max_examples_per_user: int,
             clip_method: UserClipMethod = UserClipMethod.GROUP_NORM) -> "PrivacyUnitConfig":
        """The user level with cap ``k`` (exact group norms by default)."""
        return cls(PrivacyUnit.USER, max_examples_per_user, clip_method)

    @property
    def is_user_level(self) -> bool:
        return self.unit is PrivacyUnit.USER

    def clipping(self, segments: UserSegments) -> Optional[UserClipping]:
        """The ``users`` argument of ``clip_gradients`` for a batch with these segments (``None`` at the example level)."""
        if not self.is_user_level:
            return None
        return UserClipping(segments, self.clip_method, self.max_examples_per_user)

    def describe(self) -> dict:
        """Fields of the JSON line."""
        if not self.is_user_level:
            return {"privacy_unit": PrivacyUnit.EXAMPLE.value}
        return {"privacy_unit": PrivacyUnit.USER.value, "max_examples_per_user": self.max_examples_per_user,
                "user_clipping": self.clip_method.value}
