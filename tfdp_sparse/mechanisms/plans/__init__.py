"""Pure-Python privacy plans, one module per algorithm (no TensorFlow import).

Each module defines ``KNOBS`` (the ``PrivacyConfig.extra`` names it accepts)
and ``plan_from_config(config) -> Plan``; the registry in
:mod:`tfdp_sparse.mechanisms` names these modules. See :mod:`.base`.
"""
