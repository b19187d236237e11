"""Includes and imports run one way (tests/dependency_graph.py): no cycle between files, between the
folders of src/, or between the parts of the oga package."""
import pytest

from dependency_graph import (all_cycles, component_graph, cpp_component, cpp_file_graph, cycles,
                              python_component, python_module_graph)


@pytest.mark.parametrize("graph", ["C++ files", "C++ components", "Python modules", "Python components"])
def test_no_cycles(graph):
    found = all_cycles()[graph]
    assert not found, f"{graph}: dependency cycles:\n" + "\n".join(
        f"  {', '.join(members)} (e.g. {loop})" for members, loop in found)


def test_the_graphs_see_the_known_edges():
    # The checker reads what it should: a checker that found no edges would find no cycles either.
    cpp = component_graph(cpp_file_graph(), cpp_component)
    assert {"src/cache", "src/scheduler", "src/plan", "src/decoders"} <= cpp["src/engine"]
    assert "src/plan" in cpp["src/cache"] and "src/cache" in cpp["src/scheduler"]
    assert "src/engine" in cpp["src/compat"] and "include" in cpp["src/capi"]
    python = component_graph(python_module_graph(), python_component)
    assert {"oga.serve", "oga.model_loading"} <= python["oga.cli"]  # lazy imports count
    assert "oga.model_loading" in python["oga.serve"] and "oga.introspection" in python["oga.serve"]
    assert "oga.testing" not in python["oga.serve"]  # production code does not import the test helpers
    assert "oga.executor" in python["oga"]


def test_cycles_are_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "d"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"x": {"y"}, "y": {"x"}}) == [["x", "y"]]
    assert cycles({"x": {"y"}, "y": set()}) == []
