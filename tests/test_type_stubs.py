"""oga/_core.pyi describes the extension module as built: every class, method, property and module
function of oga._core has a stub and every stub exists at run time (so a type checker sees exactly
the surface there is), and oga ships py.typed (PEP 561) with the stubs."""
import ast
import os

import pytest

import oga
from oga import _core

PACKAGE = os.path.dirname(os.path.abspath(oga.__file__))
STUB = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "oga", "_core.pyi")


def stub_tree():
    with open(STUB, encoding="utf-8") as f:
        return ast.parse(f.read())


def stub_classes():
    return {node.name: node for node in stub_tree().body if isinstance(node, ast.ClassDef)}


def stub_members(node):
    names = set()
    for item in node.body:
        if isinstance(item, ast.FunctionDef):
            names.add(item.name)
        elif isinstance(item, ast.Assign):
            names.update(t.id for t in item.targets if isinstance(t, ast.Name))
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
    return names


def runtime_classes():
    return {name: value for name, value in vars(_core).items()
            if isinstance(value, type) and value.__module__ == "oga._core" and not name.startswith("_")}


PROTOCOL = {"__len__", "__getitem__", "__iter__"}


def public(cls):
    return {name for name in vars(cls) if not name.startswith("_") or name in PROTOCOL}


def test_every_class_has_a_stub_and_every_stub_a_class():
    assert set(stub_classes()) == set(runtime_classes())


@pytest.mark.parametrize("name", sorted(runtime_classes()))
def test_members_match(name):
    cls = runtime_classes()[name]
    stubbed = stub_members(stub_classes()[name])
    if issubclass(cls, __import__("enum").Enum):
        assert stubbed == set(cls.__members__)
        return
    # Attributes the extension type declares but does not document as API: the handle's path.
    runtime = public(cls) | ({"path"} if hasattr(cls, "path") else set())
    runtime.discard("__init__")
    stubbed.discard("__init__")
    assert stubbed - {"path"} == runtime - {"path"}


def test_module_functions_match():
    functions = {node.name for node in stub_tree().body if isinstance(node, ast.FunctionDef)}
    runtime = {name for name, value in vars(_core).items()
               if callable(value) and not isinstance(value, type) and not name.startswith("__")}
    assert functions == runtime


def test_the_package_is_typed():
    source = os.path.dirname(STUB)
    assert os.path.isfile(os.path.join(source, "py.typed"))
    for directory in {source, PACKAGE}:
        if os.path.isfile(os.path.join(directory, "_core.pyi")):
            assert os.path.isfile(os.path.join(directory, "py.typed"))
