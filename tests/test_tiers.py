"""The tier table itself (tests/tiers.py): every moved test and every cover exists, and no cover moved too."""
import ast
import os

import pytest

from tests.tiers import FULL_ONLY, full_only, markdown_table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _defined_tests(path: str) -> set:
    """``function`` and ``Class::function`` names of the test functions defined in ``path``."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as source:
        tree = ast.parse(source.read())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tests."):
            names |= {a.asname or a.name for a in node.names if (a.asname or a.name).startswith("test_")}
        elif isinstance(node, ast.ClassDef):
            names |= {f"{node.name}::{f.name}" for f in node.body if isinstance(f, ast.FunctionDef)}
            names |= {f"{node.name}::{n}" for n in _inherited(tree, node)}
    return names


def _inherited(tree: ast.Module, cls: ast.ClassDef) -> set:
    """Test methods a class gets from the bases defined or imported in the same file (mechanism contracts)."""
    bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in cls.bases}
    names = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in bases:
            names |= {f.name for f in node.body if isinstance(f, ast.FunctionDef)} | _inherited(tree, node)
    if bases - {n.name for n in tree.body if isinstance(n, ast.ClassDef)}:
        names.add("*")  # a base from another module: its methods are checked where it is defined
    return names


def _exists(nodeid: str) -> bool:
    path, _, name = nodeid.partition("::")
    if not os.path.isfile(os.path.join(ROOT, path)):
        return False
    defined = _defined_tests(path)
    function = name.split("[", 1)[0]
    cls = function.split("::")[0]
    return function in defined or f"{cls}::*" in defined


def _slow_marks(root: str = ROOT) -> list[str]:
    """``file:line`` of every ``mark.slow`` in the test files (this one excepted)."""
    found = []
    for folder, _, files in os.walk(os.path.join(root, "tests")):
        for name in sorted(files):
            path = os.path.join(folder, name)
            if not name.endswith(".py") or os.path.samefile(path, __file__):
                continue
            with open(path, encoding="utf-8") as source:
                found += [f"{os.path.relpath(path, root)}:{i}" for i, line in enumerate(source, 1) if "mark.slow" in line]
    return found


def test_no_test_is_marked_slow(tmp_path):
    """A slow-marked test ran in neither tier (CI runs make test-all), so it proved nothing: a long test goes to
    the full tier here instead. (pytest.ini's --strict-markers also refuses the unregistered mark.)"""
    assert _slow_marks() == []
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("@pytest.mark.slow\ndef test_x(): pass\n")
    assert _slow_marks(str(tmp_path)) == ["tests/test_x.py:1"]


@pytest.mark.parametrize("nodeid", sorted(FULL_ONLY))
def test_each_moved_test_exists_and_names_fast_tests_that_exist(nodeid):
    assert _exists(nodeid), f"{nodeid} is in tests/tiers.py but no such test is defined"
    moved = FULL_ONLY[nodeid]
    assert moved.covered_by and moved.why
    for cover in moved.covered_by:
        assert _exists(cover), f"{nodeid}: its cover {cover} is not a defined test"
        assert not full_only(cover), f"{nodeid}: its cover {cover} is itself in the full tier"


def test_full_only_matches_whole_functions_and_single_parametrisations():
    whole = "tests/test_make_private.py::test_target_epsilon_calibrates_sigma_for_every_mechanism"
    assert full_only(whole) and full_only(whole + "[x]")
    one = "tests/test_one_private_step.py::test_trainer_and_fit_end_equal"
    assert full_only(one + "[dpsgd]") and not full_only(one + "[lazydp]") and not full_only(one)


def test_docs_testing_md_holds_the_current_table():
    with open(os.path.join(ROOT, "docs", "TESTING.md"), encoding="utf-8") as doc:
        text = doc.read()
    assert markdown_table() in text, "docs/TESTING.md is stale: rewrite its table with `python -m tests.tiers`"


def test_every_mechanisms_sensitivity_and_noise_law_stay_in_the_fast_tier():
    """The contract (clipped-sum sensitivity, KS at σ rejecting σ·(1±⅓), for every registered mechanism, which
    ``test_every_registered_algorithm_has_a_contract_subclass`` enforces) and the per-mechanism files never move."""
    guarded = ("tests/test_mechanism_contract.py", "tests/test_mech_", "tests/test_tpu_noise.py",
               "tests/test_sensitivity_negatives.py", "tests/test_clip_users.py")
    moved = [n for n in FULL_ONLY if n.startswith(guarded)]
    assert not moved, f"these prove a mechanism's guarantee and must stay in make test: {moved}"
