"""Every public name of onnxruntime-genai 0.18 is importable from `oga`, compared against the
installed `onnxruntime_genai` (a test dependency) at test time. Names oga does not implement
(oga/unsupported.py) import, annotate and `isinstance` fine, and raise one clear error when used;
class-level constants and enum members have 0.18's values."""

import importlib
import inspect
import os
import re
import subprocess
import sys

import pytest

import oga as og
import oga.unsupported

ort_genai = pytest.importorskip("onnxruntime_genai")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORT_PUBLIC_NAMES = sorted(name for name in dir(ort_genai) if not name.startswith("_"))
ORT_CLASSES = [name for name in ORT_PUBLIC_NAMES if isinstance(getattr(ort_genai, name), type)]
UNSUPPORTED = list(oga.unsupported.__all__)
UNSUPPORTED_METHODS = [
    (name, method)
    for name in UNSUPPORTED
    for method in sorted(vars(getattr(oga.unsupported, name)))
    if not method.startswith("_")
]
ERROR = r"^og\.{} is not supported by oga yet \(.+ in onnxruntime-genai 0\.18\); see README 'Not supported by oga'\.$"


def _class_constants(cls):
    """Class-level values (enum members, constants): what is neither a routine nor a descriptor."""
    constants = {}
    for attr in dir(cls):
        if attr.startswith("_"):
            continue
        static = inspect.getattr_static(cls, attr)
        if callable(static) or isinstance(static, (property, staticmethod, classmethod)) or inspect.isdatadescriptor(static):
            continue
        constants[attr] = getattr(cls, attr)
    return constants


def test_the_reference_lists_names():
    # Guards against comparing with an empty module (a broken install).
    assert {"Engine", "Generator", "Images", "Model", "Tokenizer"} <= set(ORT_PUBLIC_NAMES)


@pytest.mark.parametrize("name", ORT_PUBLIC_NAMES)
def test_every_public_name_of_0_18_is_importable(name):
    assert hasattr(og, name), f"og.{name} is missing"
    theirs, ours = getattr(ort_genai, name), getattr(og, name)
    if isinstance(theirs, type):
        assert isinstance(ours, type), f"og.{name} must stay a class"
    elif inspect.ismodule(theirs):
        assert inspect.ismodule(ours)
    else:
        assert callable(ours) == callable(theirs)
    exec(f"from oga import {name}", {})


def test_the_extension_module_name_is_the_package():
    # 0.18: onnxruntime_genai.onnxruntime_genai is the compiled module holding every name.
    assert og.onnxruntime_genai is og
    assert importlib.import_module("oga.onnxruntime_genai") is og
    namespace = {}
    exec("from oga import *", namespace)
    assert "onnxruntime_genai" not in namespace  # would shadow the user's own import


@pytest.mark.parametrize("name", ORT_CLASSES)
def test_class_constants_and_enum_members_have_0_18_values(name):
    theirs, ours = getattr(ort_genai, name), getattr(og, name)
    expected = _class_constants(theirs)
    for attr, value in expected.items():
        assert hasattr(ours, attr), f"og.{name}.{attr} is missing"
        got = getattr(ours, attr)
        if isinstance(value, (str, float)):
            assert got == value
        else:
            assert int(got) == int(value), f"og.{name}.{attr}"
    members = getattr(theirs, "__members__", None)
    if members is not None:
        assert {k: int(v) for k, v in getattr(ours, "__members__").items()} == {k: int(v) for k, v in members.items()}


def test_module_constants_have_0_18_values():
    for name in ORT_PUBLIC_NAMES:
        value = getattr(ort_genai, name)
        if not (callable(value) or inspect.ismodule(value)):
            assert getattr(og, name) == value, name


def test_unsupported_names_are_the_names_oga_lacks():
    assert UNSUPPORTED and set(UNSUPPORTED) <= set(ORT_PUBLIC_NAMES)
    for name in UNSUPPORTED:
        assert getattr(og, name) is getattr(oga.unsupported, name)
        assert name in og.__all__
    stubs = [value for name, value in vars(oga.unsupported).items() if name in UNSUPPORTED]
    for name in set(ORT_PUBLIC_NAMES) - set(UNSUPPORTED):
        assert not any(getattr(og, name) is stub for stub in stubs), f"og.{name} is implemented, not a stub"


@pytest.mark.parametrize("name", UNSUPPORTED)
def test_unsupported_classes_keep_0_18_methods(name):
    theirs = {m for m in vars(getattr(ort_genai, name)) if not m.startswith("_")}
    ours = {m for m in vars(getattr(og, name)) if not m.startswith("_")}
    assert ours == theirs
    for method in theirs:
        assert isinstance(inspect.getattr_static(getattr(og, name), method), staticmethod) == isinstance(
            inspect.getattr_static(getattr(ort_genai, name), method), staticmethod), method


@pytest.mark.parametrize("name", UNSUPPORTED)
def test_unsupported_class_raises_the_clear_error_when_constructed(name):
    cls = getattr(og, name)
    assert isinstance(cls, type) and cls.__name__ == name
    with pytest.raises(NotImplementedError, match=ERROR.format(re.escape(name))):
        cls()
    with pytest.raises(RuntimeError, match="not supported by oga yet"):  # 0.18's errors are RuntimeError
        cls(object(), object(), key="value")

    class Derived(cls):
        def __init__(self):
            pass

    with pytest.raises(NotImplementedError, match=ERROR.format(re.escape(name))):
        Derived()


@pytest.mark.parametrize("name,method", UNSUPPORTED_METHODS)
def test_unsupported_methods_raise_the_clear_error_when_called(name, method):
    function = getattr(getattr(oga.unsupported, name), method)
    with pytest.raises(NotImplementedError, match=ERROR.format(re.escape(f"{name}.{method}"))):
        function("argument")


@pytest.mark.parametrize("name", ["Generator", "GeneratorParams", "Tokenizer", "TokenizerStream"])
def test_implemented_generation_classes_keep_0_18_methods(name):
    theirs = {m for m in vars(getattr(ort_genai, name)) if not m.startswith("_")}
    ours = {m for m in dir(getattr(og, name)) if not m.startswith("_")}
    assert theirs <= ours, sorted(theirs - ours)


def test_isinstance_and_annotations_work():
    for name in UNSUPPORTED:
        cls = getattr(og, name)
        assert not isinstance(object(), cls)
        assert issubclass(type("Sub", (cls,), {}), cls)


EXAMPLE_HELPERS = '''
import oga as og


def get_user_images(image_paths: list[str]) -> og.Images | None:
    if not image_paths:
        return None
    return og.Images.open(*image_paths)


def get_user_audios(audio_paths: list[str]) -> og.Audios | None:
    return og.Audios.open(*audio_paths) if audio_paths else None


def get_inputs(processor: og.MultiModalProcessor, prompt: str, images: og.Images = None,
               audios: og.Audios = None) -> og.NamedTensors:
    return processor(prompt, images=images, audios=audios)


def make_generator(model: og.Model, params: og.GeneratorParams) -> og.Generator:
    return og.Generator(model, params)


def is_image(value) -> bool:
    return isinstance(value, og.Images)
'''


def test_example_style_helpers_that_annotate_with_og_images_import(tmp_path, monkeypatch):
    """Like OGA's examples/python/common.py: annotations are evaluated at import, calls fail clearly."""
    (tmp_path / "oga_example_helpers.py").write_text(EXAMPLE_HELPERS, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    helpers = importlib.import_module("oga_example_helpers")
    try:
        assert inspect.signature(helpers.get_inputs).return_annotation is og.NamedTensors
        assert helpers.get_user_images([]) is None
        assert helpers.is_image("x.png") is False
        with pytest.raises(RuntimeError, match=ERROR.format(re.escape("Images.open"))):
            helpers.get_user_images(["x.png"])
        with pytest.raises(TypeError):  # og.Generator is implemented: it wants a Model
            helpers.make_generator(None, None)
    finally:
        sys.modules.pop("oga_example_helpers", None)


def test_importing_oga_never_raises_for_unsupported_names():
    code = ("import oga as og\n"
            f"names = {ORT_PUBLIC_NAMES!r}\n"
            "assert all(hasattr(og, n) for n in names)\n"
            "from oga import Images, Generator, NamedTensors\n"
            "print('ok')\n")
    env = dict(os.environ)
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(og.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "ok"


def test_readme_lists_every_unsupported_name():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    match = re.search(r"^## Not supported by oga\n(.*?)(?=^## |\Z)", readme, re.S | re.M)
    assert match, "README needs a 'Not supported by oga' section"
    listed = set(re.findall(r"^- `og\.(\w+)`", match.group(1), re.M))
    assert listed == set(UNSUPPORTED)
