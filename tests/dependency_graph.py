"""The dependency graphs of the source tree: `#include`s between the C++ files (src/, include/, ortops/,
native_executor/, cuda/) and imports between oga's Python modules, and the cycles in them.

Dependencies must run one way (DESIGN.md: "Include and import graphs without cycles"), at two grains:

- files: no header or module reaches itself through its includes or imports;
- components: the folders of src/ (base, config, cache, scheduler, ...) and the other C++ folders, and
  the top-level parts of the oga package (oga.cli, oga.serve, oga.executor, oga.testing, ...), where a
  component depends on another when any of its files includes or imports one of the other's. A cycle
  here (the cache including the scheduler's header while the scheduler includes the cache) is what
  makes a component impossible to build or test without the other.

Python imports count wherever they stand (a function's lazy import too: it runs all the same), except
under `if TYPE_CHECKING:`. The package itself (`import oga`, `from oga import Model`) is the public
facade, `oga/__init__.py`: its own imports are edges like any other, so a part that imports `oga` and
is imported by `oga/__init__.py` forms a cycle.

    python -m tests.dependency_graph          # prints both component graphs and every cycle; exit 1 on a cycle
"""
import ast
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Folders whose files are C++ sources of the build, and the include paths setup.py compiles them with.
CPP_FOLDERS = ("src", "include", "ortops", "native_executor", "cuda")
INCLUDE_PATHS = ("src", "include", "ortops", "native_executor")
CPP_SUFFIXES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


def _walk(folder, suffixes):
    for directory, subdirs, files in os.walk(os.path.join(ROOT, folder)):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith((".", "__pycache__", "build")))
        for name in sorted(files):
            if name.endswith(suffixes):
                yield os.path.relpath(os.path.join(directory, name), ROOT).replace(os.sep, "/")


def cpp_file_graph():
    """{file: set of files it includes}, over the project's own files (system headers left out)."""
    files = [path for folder in CPP_FOLDERS for path in _walk(folder, CPP_SUFFIXES)]
    known = set(files)
    graph = {}
    for path in files:
        with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as f:
            text = f.read()
        edges = set()
        for name in _INCLUDE.findall(text):
            candidates = [os.path.normpath(os.path.join(os.path.dirname(path), name)).replace(os.sep, "/")]
            candidates += [f"{base}/{name}" for base in INCLUDE_PATHS]
            target = next((c for c in candidates if c in known), None)
            if target is not None and target != path:
                edges.add(target)
        graph[path] = edges
    return graph


def cpp_component(path):
    """src/cache/paged_cache.h -> src/cache; include/oga/oga.h -> include; ortops/x.h -> ortops."""
    parts = path.split("/")
    return "/".join(parts[:2]) if parts[0] == "src" and len(parts) > 2 else parts[0]


def _module_name(path):
    name = path[:-len(os.path.splitext(path)[1])].replace("/", ".")
    return name[:-len(".__init__")] if name.endswith(".__init__") else name


def _is_type_checking(test):
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree, module, is_package):
    """The absolute names `tree` imports, each as a list of candidates to resolve in order: `from X
    import y` is module X.y when there is one, else X (a name of X's); `import X.y` is X.y. A
    submodule's import of its parent packages (which Python runs first, whatever it imports) is not
    an edge by itself: `from .. import device` depends on oga.device, not on oga/__init__.py."""
    package = module if is_package else module.rpartition(".")[0]
    names = []

    def visit(node):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.extend([alias.name] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            names.extend([f"{source}.{alias.name}", source] for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


_CYTHON_IMPORT = re.compile(r"^\s*(?:from\s+(\.*[\w.]*)\s+import\s+([\w, ]+)|import\s+([\w.]+))", re.MULTILINE)


def _resolve(candidates, known):
    """The first candidate that is a known module, else the longest known prefix of the last one
    (`import oga.serve.app.helper` -> oga.serve.app); None for modules outside oga."""
    for name in candidates:
        if name in known:
            return name
    parts = candidates[-1].split(".")
    for end in range(len(parts) - 1, 0, -1):
        if ".".join(parts[:end]) in known:
            return ".".join(parts[:end])
    return None


def python_module_graph():
    """{module: set of oga modules it imports}, over oga/ (.py, and the Python imports of .pyx/.pxi:
    the .pxi parts count as their module oga._core)."""
    sources = {}
    for path in _walk("oga", (".py", ".pyx", ".pxi")):
        module = "oga._core" if path.endswith(".pxi") else _module_name(path)
        sources.setdefault(module, []).append(path)
    known = set(sources)
    graph = {}
    for module, paths in sources.items():
        edges = set()
        for path in paths:
            is_package = path.endswith("__init__.py")
            with open(os.path.join(ROOT, path), encoding="utf-8") as f:
                text = f.read()
            if path.endswith(".py"):
                names = _imports(ast.parse(text, path), module, is_package)
            else:
                names = []
                for source, items, plain in _CYTHON_IMPORT.findall(text):
                    if plain:
                        names.append([plain])
                        continue
                    dots = len(source) - len(source.lstrip("."))
                    base = module.rpartition(".")[0].split(".") if dots else []
                    source = ".".join(base + [source.lstrip(".")] if source.lstrip(".") else base)
                    names.extend([f"{source}.{item.strip()}", source] for item in items.split(","))
            for candidates in names:
                target = _resolve(candidates, known)
                if target is not None and target != module:
                    edges.add(target)
        graph[module] = edges
    return graph


def python_component(module):
    """oga.serve.app -> oga.serve; oga.cli -> oga.cli; oga -> oga (the facade)."""
    return ".".join(module.split(".")[:2])


def component_graph(file_graph, component):
    graph = {}
    for source, targets in file_graph.items():
        edges = graph.setdefault(component(source), set())
        for target in targets:
            if component(target) != component(source):
                edges.add(component(target))
                graph.setdefault(component(target), set())
    return graph


def cycles(graph):
    """The strongly connected components of `graph` with more than one node, each as a sorted list
    (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1:
                    found.append(sorted(members))
    return sorted(found)


def cycle_path(graph, members):
    """One concrete loop through a cycle's members (for the message): a -> b -> ... -> a."""
    inside = set(members)
    start = members[0]
    # Breadth-first from start's successors back to start, within the cycle.
    previous = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph.get(node, ())):
                if child not in inside:
                    continue
                if child == start:
                    path = [start]
                    while node is not None:
                        path.append(node)
                        node = previous[node]
                    return " -> ".join(reversed(path))
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    return " -> ".join(members)


def all_cycles():
    """{graph name: [(members, one loop as text)]} for the four graphs."""
    cpp_files = cpp_file_graph()
    python_modules = python_module_graph()
    graphs = {
        "C++ files": cpp_files,
        "C++ components": component_graph(cpp_files, cpp_component),
        "Python modules": python_modules,
        "Python components": component_graph(python_modules, python_component),
    }
    return {name: [(members, cycle_path(graph, members)) for members in cycles(graph)]
            for name, graph in graphs.items()}


def main():
    cpp_components = component_graph(cpp_file_graph(), cpp_component)
    python_components = component_graph(python_module_graph(), python_component)
    for title, graph in (("C++ components", cpp_components), ("Python components", python_components)):
        print(f"{title}:")
        for node in sorted(graph):
            print(f"  {node} -> {', '.join(sorted(graph[node])) or '(nothing)'}")
    found = all_cycles()
    total = sum(len(c) for c in found.values())
    for name, entries in found.items():
        print(f"{name}: {len(entries)} cycle(s)")
        for members, loop in entries:
            print(f"  {', '.join(members)}\n    e.g. {loop}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
