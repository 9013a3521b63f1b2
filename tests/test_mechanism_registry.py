"""Issue 21 item 1: plans never import rules; algorithms are registered with register(name, plan, rule).

The built-in mechanisms are registered in one place (``mechanisms/builtin.py``); a
rule is built as ``Rule(plan, noise)``; the import graph runs one way (rules and
the registry may import plans, plans import neither).
"""

import ast
import os
import subprocess
import sys

import pytest

from tfdp_sparse import mechanisms
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.mechanisms import builtin
from tfdp_sparse.mechanisms.plans.dpsgd import DPSGDPlan
from tfdp_sparse.noise_source import NoiseSource

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLANS_DIR = os.path.join(ROOT, "tfdp_sparse", "mechanisms", "plans")
#: What a plan module may import from the package: other plans, and leaves that import no rule.
ALLOWED = ("tfdp_sparse.mechanisms.plans", "tfdp_sparse.accounting", "tfdp_sparse.config", "tfdp_sparse.selection")

CONFIGS = {
    "sgd": (),
    "dpsgd": (),
    "eana": (),
    "lazydp": (),
    "dpfest": (("k", 3), ("kept_ids", ((1, 2, 3),))),
    "adafest": (("tau", 1.0), ("sigma_ratio", 3.0)),
    "adafest_plus": (("tau", 1.0), ("sigma_ratio", 3.0), ("k", 3), ("kept_ids", ((1, 2, 3),))),
}


def _imports(path: str) -> list[str]:
    """Every module a file imports, at any depth (function bodies included)."""
    tree = ast.parse(open(path).read(), filename=path)
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append("." * node.level + (node.module or ""))
    return names


@pytest.mark.parametrize("filename", sorted(f for f in os.listdir(PLANS_DIR) if f.endswith(".py")))
def test_plan_modules_import_no_rule_and_no_tensorflow(filename):
    imported = _imports(os.path.join(PLANS_DIR, filename))
    assert not [n for n in imported if n.startswith(".")], f"{filename}: relative import {imported}"
    package = [n for n in imported if n.startswith("tfdp_sparse")]
    bad = [n for n in package if not n.startswith(ALLOWED)]
    assert not bad, f"{filename} imports {bad}: a plan must not import a rule (or anything that does)"
    assert not [n for n in imported if n.split(".")[0] in ("tensorflow", "keras", "tf_keras")], filename


def test_plans_plan_and_register_with_every_rule_module_blocked():
    """In a fresh interpreter where importing any rule module (or TensorFlow) fails: every plan is made."""
    rules = sorted(rule.partition(":")[0] for _, _, rule in builtin.BUILTIN) + [
        "tfdp_sparse.mechanisms.base", "tfdp_sparse.mechanisms.dpfest_lazy", "tfdp_sparse.mechanisms.bucket_selection",
        "tensorflow"]
    code = (
        "import sys\n"
        f"for name in {rules!r}: sys.modules[name] = None  # import raises ImportError\n"
        "from tfdp_sparse import mechanisms\n"
        "from tfdp_sparse.config import PrivacyConfig\n"
        f"for algorithm, extra in {CONFIGS!r}.items():\n"
        "    p = mechanisms.plan(PrivacyConfig(algorithm=algorithm, noise_multiplier=1.0, extra=extra))\n"
        "    assert p.name == algorithm and mechanisms.knobs(algorithm) is not None\n"
        "    p.step_event(0.01); p.requires(); p.describe()\n"
        "mechanisms.register('late', 'tfdp_sparse.mechanisms.plans.dpsgd', 'some.rule:Rule')\n"
        "print(len(mechanisms.available()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == str(len(builtin.BUILTIN) + 1)


def test_builtins_are_registered_in_one_place_and_each_rule_is_rule_of_plan_and_noise():
    assert list(mechanisms.ALGORITHMS) == [name for name, _, _ in builtin.BUILTIN] == list(mechanisms.available())
    assert set(CONFIGS) == set(mechanisms.ALGORITHMS)
    for algorithm, extra in CONFIGS.items():
        plan = mechanisms.plan(PrivacyConfig(algorithm=algorithm, noise_multiplier=1.0, extra=extra))
        rule = mechanisms.build_rule(plan, NoiseSource.reproducible(4))
        assert rule.plan is plan and rule.noise_source == NoiseSource(4), algorithm
        assert type(rule)(plan, 4).plan is plan  # the rule class itself is Rule(plan, noise)


def test_register_refuses_duplicates_bad_references_and_the_view_is_read_only():
    with pytest.raises(ValueError, match="already registered"):
        mechanisms.register("dpsgd", "tfdp_sparse.mechanisms.plans.dpsgd", "tfdp_sparse.mechanisms.dpsgd:DPSGDRule")
    with pytest.raises(ValueError, match="'module:attribute' or a callable"):
        mechanisms.register("x", "tfdp_sparse.mechanisms.plans.dpsgd", "tfdp_sparse.mechanisms.dpsgd.DPSGDRule")
    with pytest.raises(TypeError, match="module or its import path"):
        mechanisms.register("x", DPSGDPlan, "tfdp_sparse.mechanisms.dpsgd:DPSGDRule")
    with pytest.raises(TypeError):
        mechanisms.ALGORITHMS["x"] = "tfdp_sparse.mechanisms.plans.dpsgd"  # edit it with register
    with pytest.raises(KeyError, match="not registered"):
        mechanisms.unregister("x")
    assert "x" not in mechanisms.ALGORITHMS


def test_registered_plugin_is_built_and_unregistered():
    from tests.plugins import toy_mechanism

    toy_mechanism.register()
    try:
        mech = mechanisms.build(PrivacyConfig(algorithm=toy_mechanism.NAME, noise_multiplier=1.0), seed=0)
        assert isinstance(mech, toy_mechanism.TouchedRowsTwoSigma) and mechanisms.knobs(toy_mechanism.NAME) == {"factor"}
    finally:
        mechanisms.unregister(toy_mechanism.NAME)
    with pytest.raises(ValueError, match="unknown algorithm 'toy_touched_2sigma'"):
        mechanisms.plan(PrivacyConfig(algorithm=toy_mechanism.NAME))


def test_a_rule_that_drops_its_plan_is_refused():
    from tfdp_sparse.mechanisms.dpsgd import DPSGDRule

    mechanisms.register("dropping", "tfdp_sparse.mechanisms.plans.dpsgd",
                        lambda plan, noise: DPSGDRule(DPSGDPlan(noise_multiplier=plan.noise_multiplier,
                                                                 l2_norm_clip=plan.l2_norm_clip), noise))
    try:
        plan = DPSGDPlan(noise_multiplier=1.0, l2_norm_clip=1.0)
        object.__setattr__(plan, "name", "dropping")  # a plan under the plugin's name
        with pytest.raises(TypeError, match="did not keep its plan"):
            mechanisms.build_rule(plan)
    finally:
        mechanisms.unregister("dropping")
