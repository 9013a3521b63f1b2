"""The layer registry: one clipping rule per layer kind, attached to a model explicitly.

Ghost clipping needs, for each layer holding trainable weights, the
tensors on each side of them (:mod:`tfdp_sparse.clipping.taps`). A
:class:`LayerRegistry` maps a layer *type* (exact type, as TF Privacy's
``fast_gradient_clipping`` registry does: a subclass may change ``call``)
to a rule that computes the layer's output and records its taps.
:func:`attach_taps` gives every layer of one model its rule and returns the
:class:`~tfdp_sparse.clipping.taps.TapRecorder` the rules write to; every
layer also reports that it was called (:class:`~tfdp_sparse.clipping.taps.LayerTap`),
so the private step can refuse layers no rule covers
(:mod:`tfdp_sparse.clipping.coverage`). Nothing is patched at import time
and no state is global: the wrappers live on the model's own layer
instances, until :func:`detach_taps`.

Adding a layer kind: write ``rule(layer, recorder, call, *args, **kwargs)``
that returns the layer's output, reads the weights its taps cover through
:func:`~tfdp_sparse.clipping.taps.tap_read` and calls ``recorder.record(...)``,
then ``registry.register(MyLayer, rule)``. A layer kind of the toolkit brings its
rule itself (:class:`CarriesClippingRule`: ``layers/`` gives ``DPEmbedding`` its own,
so this package never imports the layers); a registered rule takes precedence.

A registry may also have a *fallback* rule for layers of no registered type
that hold trainable variables outside ruled sub-layers (and no other state):
:func:`default_registry` uses the exact per-example recomputation of
:mod:`tfdp_sparse.clipping.generic`.

Example::

    recorder = attach_taps(model)                 # default_registry()
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    result = clip_gradients(loss, tape, model.trainable_variables, recorder.take(), 1.0)
"""

from __future__ import annotations

import importlib.util
import inspect
import types
from typing import Callable, Mapping, Optional

import tensorflow as tf
from tensorflow.python.autograph.impl.api import autograph_artifact  # no public equivalent

from tfdp_sparse.clipping import conv1d, einsum_dense, generic, keras_layers, layer_norm, recurrent, time_distributed
from tfdp_sparse.clipping.taps import LayerTap, TapRecorder
from tfdp_sparse.keras_stack import is_keras_3, model_layers

#: ``rule(layer, recorder, call, *args, **kwargs) -> outputs``.
LayerRule = Callable[..., object]

# Attribute on a wrapper holding the layer's own ``call`` (to re-attach or detach).
_ORIGINAL = "_tfdp_original_call"


class CarriesClippingRule:
    """A layer class that brings its own clipping rule, for exactly itself.

    :meth:`clipping_rule` returns the rule of ``cls`` or ``None``. A layer
    class answers for its own type only (``cls is MyLayer``): a subclass may
    change ``call``, so it gets no rule from its parent and is treated like any
    unregistered layer (the fallback, or a refusal), as the registry treats types.

    Example::

        class MyTable(tf.keras.layers.Layer, CarriesClippingRule):
            @classmethod
            def clipping_rule(cls):
                return my_table_rule if cls is MyTable else None
    """

    @classmethod
    def clipping_rule(cls) -> Optional["LayerRule"]:
        """The rule of exactly ``cls`` (``None``: no rule of its own)."""
        return None


class LayerRegistry:
    """Layer type -> clipping rule (exact types; see module docstring).

    Args:
      rules: initial ``{layer type: rule}``.
      fallback: the rule of layers without one that hold trainable variables
        outside ruled sub-layers and no non-trainable ones
        (:func:`tfdp_sparse.clipping.generic.needs_fallback`); ``None``: no
        fallback, such layers are refused.
    """

    def __init__(self, rules: Optional[Mapping[type, LayerRule]] = None, fallback: Optional[LayerRule] = None):
        self._rules: dict[type, LayerRule] = {}
        for layer_type, rule in (rules or {}).items():
            self.register(layer_type, rule)
        if fallback is not None and not callable(fallback):
            raise TypeError(f"fallback must be callable, got {fallback!r}")
        self._fallback = fallback

    def register(self, layer_type: type, rule: LayerRule) -> None:
        """Adds the rule of ``layer_type``; refuses a second rule for the same type."""
        if not (isinstance(layer_type, type) and issubclass(layer_type, tf.keras.layers.Layer)):
            raise TypeError(f"layer_type must be a Keras Layer class, got {layer_type!r}")
        if not callable(rule):
            raise TypeError(f"rule for {layer_type.__name__} must be callable, got {rule!r}")
        if layer_type in self._rules:
            raise ValueError(f"{layer_type.__name__} already has a clipping rule in this registry")
        self._rules[layer_type] = rule

    def rule_for(self, layer: tf.keras.layers.Layer) -> Optional[LayerRule]:
        """The rule of ``type(layer)`` exactly, else the fallback if the layer needs it, else ``None``."""
        rule = self._own_rule(layer)
        if rule is None and self._fallback is not None and generic.needs_fallback(layer, self.has_rule):
            return self._fallback
        return rule

    def has_rule(self, layer: tf.keras.layers.Layer) -> bool:
        """Whether ``type(layer)`` exactly has a rule, registered or its own (the fallback does not count)."""
        return self._own_rule(layer) is not None

    def _own_rule(self, layer: tf.keras.layers.Layer) -> Optional[LayerRule]:
        """The rule registered for ``type(layer)``, else the one its class brings (:class:`CarriesClippingRule`)."""
        rule = self._rules.get(type(layer))
        if rule is None and isinstance(layer, CarriesClippingRule):
            rule = type(layer).clipping_rule()
        return rule

    def describe(self) -> str:
        """The supported layer kinds, for error messages."""
        return ", ".join(sorted(f"{t.__module__}.{t.__name__}" for t in self._rules))


def default_registry() -> LayerRegistry:
    """A new registry with the stock rules and the exact generic fallback.

    Rules: ``Dense``, ``Embedding``, the toolkit's ``DPEmbedding`` (its own, :class:`CarriesClippingRule`),
    ``LayerNormalization``, ``EinsumDense`` (so ``MultiHeadAttention``),
    ``GRU`` and ``LSTM`` (:mod:`tfdp_sparse.clipping.recurrent`), ``Conv1D`` and
    ``TimeDistributed(Dense)``; any other layer holding only
    trainable variables falls back to :func:`tfdp_sparse.clipping.generic.generic_rule`.

    On Keras 3 (:func:`tfdp_sparse.keras_stack.is_keras_3`): :func:`keras_3_registry`.
    """
    if is_keras_3():
        return keras_3_registry()
    return LayerRegistry({
        **_stock_rules(),
        tf.keras.layers.Conv1D: conv1d.conv1d_rule,
        tf.keras.layers.TimeDistributed: time_distributed.time_distributed_rule,
    }, fallback=generic.generic_rule)


def _stock_rules() -> dict:
    """The rules of the stock Keras layers both stacks cover (``tf.keras`` is the process's Keras)."""
    return {
        tf.keras.layers.Dense: keras_layers.dense_rule,
        tf.keras.layers.Embedding: keras_layers.embedding_rule,
        tf.keras.layers.LayerNormalization: layer_norm.layer_norm_rule,
        tf.keras.layers.EinsumDense: einsum_dense.einsum_dense_rule,
        tf.keras.layers.GRU: recurrent.gru_rule,
        tf.keras.layers.LSTM: recurrent.lstm_rule,
    }


def keras_3_registry() -> LayerRegistry:
    """The Keras 3 registry: ``Dense``, ``Embedding``, ``LayerNormalization``, ``EinsumDense``, ``GRU``, ``LSTM``,
    the toolkit's ``DPEmbedding`` (its own rule; one definition for both stacks), generic fallback.

    With keras-rs installed, also ``keras_rs.layers.DistributedEmbedding``
    (:mod:`tfdp_sparse.clipping.keras_rs_embedding`, default-device tables).
    (``Conv1D`` and ``TimeDistributed`` have no Keras 3 rule yet; a ``Conv1D``
    still trains on Keras 3, through the exact fallback.)
    """
    return LayerRegistry({**_stock_rules(), **_keras_rs_rules()},
                         fallback=generic.generic_rule)


def _keras_rs_rules() -> dict:
    """keras-rs's layer rules, imported here only: on Keras 3 with keras-rs installed, else none.

    keras-rs is a Keras 3 library; the tf-keras path never imports it.
    """
    if not is_keras_3() or importlib.util.find_spec("keras_rs") is None:
        return {}
    from tfdp_sparse.clipping.keras_rs_embedding import keras_rs_rules  # imports keras_rs (Keras 3 only)

    return keras_rs_rules()


def _own_call(layer: tf.keras.layers.Layer) -> Callable:
    original = _original_of(layer)
    return original if original is not None else layer.call


def _wrap(layer: tf.keras.layers.Layer, rule: Optional[LayerRule], recorder: TapRecorder) -> None:
    call = _own_call(layer)

    @autograph_artifact  # AutoGraph calls it unconverted but keeps the caller's status for `own`
    def tapped_call(self, *args, **kwargs):
        # The layer's own call is converted as Keras' __call__ would have done
        # (AutoGraph for Python control flow on tensors); rules need none.
        own = tf.__internal__.autograph.tf_convert(call, tf.__internal__.autograph.control_status_ctx())
        outputs = rule(self, recorder, own, *args, **kwargs) if rule is not None else own(*args, **kwargs)
        recorder.record(LayerTap(self))  # no-op unless a tape records
        return outputs

    # A bound method with the signature of the layer's own ``call``, so that
    # Keras and tf.function (model saving traces ``layer.call``) see
    # ``(inputs, training=None, ...)`` exactly as without the wrapper.
    function = getattr(call, "__func__", None)
    if function is not None:
        tapped_call.__signature__ = inspect.signature(function)
    tapped_call.__name__ = call.__name__
    setattr(tapped_call, _ORIGINAL, call)
    bound = types.MethodType(tapped_call, layer)
    object.__setattr__(layer, "call", bound)  # instance attribute; Keras' tracking bypassed


def _original_of(layer: tf.keras.layers.Layer) -> Optional[Callable]:
    """The layer's own ``call`` if :func:`attach_taps` wrapped it, else ``None``."""
    wrapper = layer.__dict__.get("call")
    return getattr(getattr(wrapper, "__func__", None), _ORIGINAL, None)


def attach_taps(model: tf.keras.layers.Layer, registry: Optional[LayerRegistry] = None) -> TapRecorder:
    """Gives every layer of ``model`` its rule; returns the recorder they write to.

    Attaching again (e.g. a second optimizer for the same model) replaces
    the previous wrappers, so a layer never records into two recorders.
    Layers created after this call are not covered: build the model first
    (:func:`unattached_layers` finds them; the private step refuses them).
    """
    if not isinstance(model, tf.keras.layers.Layer):
        raise TypeError(f"attach_taps needs a Keras model or layer, got {type(model).__name__}")
    registry = registry if registry is not None else default_registry()
    recorder = TapRecorder()
    for layer in model_layers(model):
        _wrap(layer, registry.rule_for(layer), recorder)
    return recorder


def detach_taps(model: tf.keras.layers.Layer) -> None:
    """Removes the wrappers :func:`attach_taps` put on ``model``'s layers."""
    for layer in model_layers(model):
        if _original_of(layer) is not None:
            object.__delattr__(layer, "call")


def unattached_layers(model: tf.keras.layers.Layer) -> list[str]:
    """Names of ``model``'s layers without tap wrappers (created after :func:`attach_taps`)."""
    return [layer.name for layer in model_layers(model) if _original_of(layer) is None]
