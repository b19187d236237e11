"""The C API's declarations as the headers state them (include/oga/oga.h, include/oga/oga_ext.h), and
what the other declarations of the same API say: oga/_core.pxd (Cython's view), tests/capi.py
SIGNATURES (the ctypes ABI table the C-level tests call through) and the C names the Cython layer and
its stubs cite. The headers are the one source of truth; tests/test_c_api_declarations.py fails on
any disagreement.

Checked rather than generated: the .pxd is read by people as the binding's map (grouped, with the
Cython spellings `nogil`, `cbool`, the `c_` handle names), the ctypes table is a plain dict the tests
import, and the stubs describe Python types the C declarations cannot give; a check keeps all three
hand-written and readable, needs no generation step in the build, and still fails on the first
declaration that drifts from the header.

    python -m tests.c_api_declarations   # prints every mismatch; exit 1 when there is one
"""
import ctypes
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADERS = ("include/oga/oga.h", "include/oga/oga_ext.h")


def _read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def _strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.DOTALL)
    return re.sub(r"//[^\n]*", " ", text)


def _split_parameters(text):
    """`const char* name, size_t count` -> ["const char*", "size_t"] (names dropped; `void` -> [])."""
    text = " ".join(text.split())
    if text in ("", "void"):
        return []
    parameters, depth, current = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            parameters.append(current)
            current = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        current += ch
    parameters.append(current)
    types = []
    for parameter in parameters:
        parameter = parameter.strip()
        if "(*" in parameter:  # a function pointer parameter: its whole spelling, name removed
            types.append(re.sub(r"\(\*\s*\w*\s*\)", "(*)", " ".join(parameter.split())))
            continue
        match = re.match(r"^(.*?[\s*])(\w+)(\[\w*\])?$", parameter)
        if match is None:  # unnamed: the whole text is the type
            types.append(_type(parameter))
        else:  # an array parameter (`uint32_t out[4]`) is a pointer
            types.append(_type(match.group(1) + ("*" if match.group(3) else "")))
    return types


def _type(text):
    text = re.sub(r"\bc_(Oga\w+)", r"\1", text)
    text = re.sub(r"\bcbool\b", "bool", text)
    text = re.sub(r"\s*\*", "*", " ".join(text.split()))
    return re.sub(r"\*(?=\w)", "* ", text).strip()


class Function:
    def __init__(self, name, result, parameters):
        self.name, self.result, self.parameters = name, result, parameters

    def __eq__(self, other):
        return (self.name, self.result, self.parameters) == (other.name, other.result, other.parameters)

    def __repr__(self):
        return f"{self.result} {self.name}({', '.join(self.parameters)})"


def header_functions():
    """{name: Function} of every OGA_EXPORT function of the headers."""
    functions = {}
    for path in HEADERS:
        text = _strip_comments(_read(path))
        for result, name, parameters in re.findall(
                r"OGA_EXPORT\s+([^;{}]*?)\s*OGA_API_CALL\s+(\w+)\s*\(([^;]*?)\)\s*;", text, re.DOTALL):
            functions[name] = Function(name, _type(result), _split_parameters(parameters))
    return functions


def header_typedefs():
    """{name: underlying scalar type} of the headers' `typedef <scalar> Name;` (constants' types)."""
    typedefs = {}
    for path in HEADERS:
        for underlying, name in re.findall(r"^typedef\s+(u?int\d+_t|size_t|float|double)\s+(\w+)\s*;",
                                           _strip_comments(_read(path)), re.MULTILINE):
            typedefs[name] = underlying
    return typedefs


def header_structs():
    """{name: [(field type, field name)]} of the headers' `typedef struct X { ... } X;`."""
    structs = {}
    for path in HEADERS:
        text = _strip_comments(_read(path))
        for name, body in re.findall(r"typedef\s+struct\s+(\w+)\s*\{(.*?)\}\s*\1\s*;", text, re.DOTALL):
            structs[name] = _fields(body)
    return structs


def _fields(body):
    fields = []
    for declaration in body.split(";"):
        declaration = " ".join(declaration.split())
        if not declaration:
            continue
        pointer = re.match(r"^(.*?)\(\s*\*\s*(\w+)\s*\)\s*\((.*)\)$", declaration)
        if pointer:  # a function pointer member
            result, name, parameters = pointer.groups()
            fields.append((f"{_type(result)} (*)({', '.join(_split_parameters(parameters))})", name))
            continue
        match = re.match(r"^(.*?[\s*])(\w+)(\[\w+\])?$", declaration)
        fields.append((_type(match.group(1)) + (match.group(3) or ""), match.group(2)))
    return fields


def header_constants():
    names = set()
    for path in HEADERS:
        names.update(re.findall(r"^#define\s+(Oga\w+)\s", _read(path), re.MULTILINE))
    return names


# ---- oga/_core.pxd --------------------------------------------------------------------------------

def pxd_declarations(text=None):
    """(functions {name: Function}, structs {name: [(type, name)]}, constant names) of the .pxd's
    `cdef extern from "oga/..."` blocks (`text`: the .pxd's, by default oga/_core.pxd)."""
    text = _read("oga/_core.pxd") if text is None else text
    text = re.sub(r"#[^\n]*", "", text)
    functions, structs, constants = {}, {}, set()
    lines = text.split("\n")
    i = 0
    block = False
    while i < len(lines):
        line = lines[i]
        if line.startswith("cdef extern from"):
            block = '"oga/' in line
            i += 1
            continue
        if not block or not line.strip():
            i += 1
            continue
        if not line.startswith(" "):
            block = False
            continue
        stripped = line.strip()
        if stripped.startswith("ctypedef struct") and stripped.endswith(":"):
            name = stripped.split()[2].rstrip(":")
            body, i = [], i + 1
            while i < len(lines) and (lines[i].startswith("        ") or not lines[i].strip()):
                if lines[i].strip():
                    body.append(lines[i].strip())
                i += 1
            structs[name] = _fields(";".join(_join_continuations(body)))
            continue
        if stripped == "enum:":
            i += 1
            while i < len(lines) and lines[i].startswith("        "):
                constants.add(lines[i].strip())
                i += 1
            continue
        if stripped.startswith(("ctypedef", "enum")):
            i += 1
            continue
        # A declaration, possibly continued on indented lines until its parentheses balance.
        statement = stripped
        while statement.count("(") > statement.count(")"):
            i += 1
            statement += " " + lines[i].strip()
        i += 1
        match = re.match(r"^(.*?)\b(Oga\w+)\s*\((.*)\)(\s*(nogil|except.*))?$", statement)
        if match:
            result, name, parameters = match.group(1), match.group(2), match.group(3)
            functions[name] = Function(name, _type(result), _split_parameters(parameters))
        else:
            constant = re.match(r"^[\w\s*]+\b(Oga\w+)$", statement)
            if constant:
                constants.add(constant.group(1))
    return functions, structs, constants


def _join_continuations(lines):
    joined = []
    for line in lines:
        if joined and joined[-1].count("(") > joined[-1].count(")"):
            joined[-1] += " " + line
        else:
            joined.append(line)
    return joined


# ---- tests/capi.py SIGNATURES ---------------------------------------------------------------------

_SCALARS = {"void": None, "bool": ctypes.c_bool, "double": ctypes.c_double, "float": ctypes.c_float,
            "size_t": ctypes.c_size_t, "int32_t": ctypes.c_int32, "uint32_t": ctypes.c_uint32,
            "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64, "uint8_t": ctypes.c_uint8,
            "char": ctypes.c_char}


def ctypes_type(c_type, typedefs, structs):
    """The ctypes type that passes `c_type` across the ABI the way tests/capi.py spells it: opaque
    handles, structs, `void*` and function pointers as c_void_p; `const char*` as c_char_p; a pointer
    to any of those as POINTER of it; scalars (and their typedefs) as their fixed-width ctypes."""
    text = re.sub(r"\bconst\b", "", c_type)
    depth = text.count("*")
    base = " ".join(text.replace("*", " ").split())
    if "(*)" in c_type or base in _FUNCTION_POINTERS:
        return ctypes.c_void_p
    base = typedefs.get(base, base)
    if base == "char" and depth >= 1:
        result, depth = ctypes.c_char_p, depth - 1
    elif base in _SCALARS and base != "void":
        result = _SCALARS[base]
    elif depth >= 1:  # void*, an opaque handle or a struct: an address
        result, depth = ctypes.c_void_p, depth - 1
    elif base == "void":
        return None
    else:
        raise ValueError(f"no ctypes spelling for {c_type!r}")
    for _ in range(depth):
        result = ctypes.POINTER(result)
    return result


_FUNCTION_POINTERS = {"OgaExtModelLoader", "OgaExtTokenTableLoader", "OgaExtTokenizeFunction"}


def _ctypes_name(value):
    return "None" if value is None else value.__name__


def _pxi_files():
    return sorted(f"oga/{n}" for n in os.listdir(os.path.join(ROOT, "oga")) if n.endswith(".pxi"))


# ---- the checks ---------------------------------------------------------------------------------

def mismatches():
    """Every disagreement between the headers and a secondary declaration, as lines of text."""
    problems = []
    functions = header_functions()
    typedefs = header_typedefs()
    structs = header_structs()
    constants = header_constants()
    global _FUNCTION_POINTERS
    _FUNCTION_POINTERS = set(re.findall(r"typedef\s+[\w\s*]+\(\*(\w+)\)",
                                        "".join(_strip_comments(_read(p)) for p in HEADERS)))

    pxd_functions, pxd_structs, pxd_constants = pxd_declarations()
    for name, declared in sorted(pxd_functions.items()):
        if name not in functions:
            problems.append(f"_core.pxd declares {name}, which the headers do not")
        elif declared != functions[name]:
            problems.append(f"_core.pxd: {declared!r}\n    header: {functions[name]!r}")
    for name, fields in sorted(pxd_structs.items()):
        if name not in structs:
            continue  # opaque handles (ctypedef struct c_X "X") have no fields
        if sorted(fields, key=lambda f: f[1]) != sorted(structs[name], key=lambda f: f[1]):
            missing = sorted(set(structs[name]) - set(fields))
            extra = sorted(set(fields) - set(structs[name]))
            problems.append(f"_core.pxd struct {name}: missing {missing}, not in the header {extra}")
    for name in sorted(pxd_constants - constants):
        problems.append(f"_core.pxd declares constant {name}, which the headers do not define")

    from capi import SIGNATURES  # tests/ is on sys.path under pytest and for python -m tests....

    for name, (result, arguments) in sorted(SIGNATURES.items()):
        if name not in functions:
            problems.append(f"tests/capi.py SIGNATURES has {name}, which the headers do not declare")
            continue
        function = functions[name]
        expected = (ctypes_type(function.result, typedefs, structs),
                    [ctypes_type(p, typedefs, structs) for p in function.parameters])
        if (result, list(arguments)) != expected:
            problems.append(
                f"tests/capi.py SIGNATURES[{name!r}]: ({_ctypes_name(result)}, "
                f"[{', '.join(map(_ctypes_name, arguments))}])\n    header {function!r} needs "
                f"({_ctypes_name(expected[0])}, [{', '.join(map(_ctypes_name, expected[1]))}])")

    # The C names the Cython layer and its stubs cite (docstrings name the function they wrap).
    cited = {}
    for path in ["oga/_core.pyx", "oga/_core.pyi"] + _pxi_files():
        for name in re.findall(r"\b(Oga(?:Ext)?[A-Z]\w*)\b", _read(path)):
            cited.setdefault(name, path)
    known = set(functions) | set(structs) | constants | set(typedefs) | _FUNCTION_POINTERS | {
        n for n in re.findall(r"typedef\s+struct\s+\w+\s+(\w+)\s*;", "".join(_read(p) for p in HEADERS))}
    python_names = set()
    for path in ("oga/_core.pyx", "oga/_core.pyi") + tuple(_pxi_files()):
        python_names.update(re.findall(r"^\s*(?:cdef\s+)?class\s+(\w+)", _read(path), re.MULTILINE))
    for name, path in sorted(cited.items()):
        if name in known or name in python_names or name in ("Oga", "OgaExt"):
            continue
        # A constant family cited by its prefix (OgaExtFaultPhase_*), or a constant's name.
        if name.rstrip("_") in known or any(c.startswith(name) for c in constants):
            continue
        problems.append(f"{path} names {name}, which the headers do not declare")
    return problems


def main():
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    problems = mismatches()
    functions = header_functions()
    pxd_functions, _, _ = pxd_declarations()
    from capi import SIGNATURES

    print(f"headers: {len(functions)} functions; _core.pxd declares {len(pxd_functions)}, "
          f"tests/capi.py SIGNATURES {len(SIGNATURES)}")
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
