"""oga against onnxruntime-genai 0.18, scenario by scenario, through Python and through the C ABI.

Every scenario of scenarios.py runs against `onnxruntime_genai` 0.18 and against `oga` with the same
backend (Python, or ctypes on each library), oga on its default native ONNX Runtime executor and again
on its Python executor (the two must record identical streams); the recorded streams must be equal except for the
records the scenario declares as deliberate differences (each naming a README bullet, and each of
which must actually differ). A scenario that shows an undeclared difference stays here marked
xfail(strict=True) with the observed difference in `Scenario.xfail`.
"""
import difflib
import os
import re

import pytest

from runner import dumps, run_scenario
from scenario import UNPINNED
from scenarios import SCENARIOS

README = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "README.md")
IMPLS = ("0.18", "oga")

_RESULTS = {}


@pytest.fixture(scope="session")
def model_dirs(conformance_model_dirs):
    """The suite's model directories (scenario.MODEL_CONFIGS), built once per session (tests/conftest.py)."""
    return conformance_model_dirs


def recorded(scenario, backend, impl, model_dirs, executor="native"):
    """The scenario's records; oga's side runs its models on `executor` (OGA_EXECUTOR)."""
    key = (scenario.name, backend, impl, executor)
    if key not in _RESULTS:
        path, overlay = model_dirs[scenario.model]
        previous = os.environ.get("OGA_EXECUTOR")
        os.environ["OGA_EXECUTOR"] = executor
        try:
            _RESULTS[key] = run_scenario(scenario, backend, impl, path, overlay)
        finally:
            if previous is None:
                del os.environ["OGA_EXECUTOR"]
            else:
                os.environ["OGA_EXECUTOR"] = previous
    return _RESULTS[key]


def _params():
    out = []
    for name, s in SCENARIOS.items():
        for backend in ("python", "ctypes"):
            if backend not in s.backends:
                continue
            marks = []
            if backend in s.xfail:
                marks.append(pytest.mark.xfail(strict=True, reason=s.xfail[backend]))
            out.append(pytest.param(name, backend, marks=marks, id=f"{name}-{backend}"))
    return out


def _diff(a, b):
    return "\n".join(difflib.unified_diff(dumps(a).splitlines(), dumps(b).splitlines(), "onnxruntime_genai 0.18",
                                          "oga", lineterm="", n=2))


@pytest.mark.parametrize("name,backend", _params())
def test_scenario_matches_0_18(name, backend, model_dirs):
    s = SCENARIOS[name]
    ref = recorded(s, backend, "0.18", model_dirs)
    got = recorded(s, backend, "oga", model_dirs)
    if s.expect is not None:
        assert s.expect(ref), f"the scenario no longer exercises what it claims on 0.18:\n{dumps(ref)}"
    assert [label for label, _ in ref] == [label for label, _ in got], _diff(ref, got)
    labels = [label for label, _ in ref]
    assert len(set(labels)) == len(labels), "record labels must be unique"
    declared = {k for k, d in s.differences.items() if backend in d.backends}
    assert declared <= set(labels), f"declared differences name unknown records: {declared - set(labels)}"
    differing = {label for (label, r), (_, g) in zip(ref, got) if r != g}
    undeclared = differing - declared
    assert not undeclared, f"undeclared differences in {sorted(undeclared)}:\n{_diff(ref, got)}"
    stale = declared - differing
    assert not stale, f"declared differences that no longer differ: {sorted(stale)}"
    # a declared difference exempts only what differs: the rest of its record must still agree, and
    # oga's side is pinned where the scenario says what it is
    ref_records, got_records = dict(ref), dict(got)
    for label in sorted(declared):
        d = s.differences[label]
        if d.same is not None:
            assert d.same(ref_records[label]) == d.same(got_records[label]), \
                f"{label}: the part of the record that must not differ does:\n{_diff(ref, got)}"
        if d.oga is not UNPINNED:
            value = got_records[label] if d.oga_part is None else d.oga_part(got_records[label])
            assert value == d.oga, f"{label}: oga recorded {value!r}, pinned {d.oga!r}"


@pytest.mark.parametrize("name,backend", _params())
def test_the_python_executor_records_what_the_native_one_records(name, backend, model_dirs):
    """The whole suite on both executors: oga's default (the native ONNX Runtime executor, above) and
    the Python executor (OGA_EXECUTOR=python) record identical streams, scenario by scenario."""
    s = SCENARIOS[name]
    native = recorded(s, backend, "oga", model_dirs)
    python = recorded(s, backend, "oga", model_dirs, executor="python")
    assert python == native, _diff(native, python)


def _normalise(records):
    """Python records in the C shape: exceptions as OgaResult, token None -> 0, stop index None -> -1."""
    def norm(v):
        if isinstance(v, tuple) and len(v) == 3 and v[0] == "raise" and v[1] == "RuntimeError":
            return ("raise", "OgaResult", v[2])
        if isinstance(v, tuple) and len(v) == 8 and isinstance(v[0], int):
            v = list(v)
            v[3] = 0 if v[3] is None else v[3]
            v[5] = -1 if v[5] is None else v[5]
            return tuple(v)
        if isinstance(v, dict):
            return {k: norm(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return type(v)(norm(x) for x in v)
        return v
    return [(label, norm(v)) for label, v in records]


def _both_backend_scenarios():
    surface_specific = ("py", "capi", "only")
    return [name for name, s in SCENARIOS.items()
            if set(s.backends) == {"python", "ctypes"} and not any(a["op"] in surface_specific for a in s.actions)]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", _both_backend_scenarios())
def test_python_and_ctypes_record_the_same_stream(name, impl, model_dirs):
    """The two backends are two views of one API: on the same implementation they must agree."""
    s = SCENARIOS[name]
    py = _normalise(recorded(s, "python", impl, model_dirs))
    c = recorded(s, "ctypes", impl, model_dirs)
    assert py == c, _diff(py, c)


def readme_differences():
    text = open(README, encoding="utf-8").read()
    section = text.split("## Deliberate differences", 1)[1].split("\n## ", 1)[0]
    return {m.rstrip(".") for m in re.findall(r"^- \*\*(.+?)\*\*", section, flags=re.M)}


def test_every_declared_difference_names_a_readme_entry():
    entries = readme_differences()
    assert entries, "README has no 'Deliberate differences' bullets"
    for s in SCENARIOS.values():
        for label, d in s.differences.items():
            assert d.readme in entries, f"{s.name}/{label}: {d.readme!r} is not a README bullet ({sorted(entries)})"
            assert d.why


def test_scenario_count():
    assert sum(len(s.backends) for s in SCENARIOS.values()) >= 120
    assert len(SCENARIOS) >= 60
