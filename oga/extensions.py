"""Where oga's compiled libraries are: the extension modules beside the package's Python files
(oga/_ortops, oga/_native_executor), looked up along the package path, which also holds the
installed copy when a source checkout shadows it (see oga/__init__.py)."""
import importlib.machinery
import os
import sys


def package_directories():
    """The oga package's directories (its __path__: the checkout's oga/ and, when that shadows an
    installed copy, the installed one; see oga/__init__.py). Read from the package module, which
    Python has imported before any of its submodules: the submodules that need it do not import the
    package (whose __init__ imports them) back."""
    return list(sys.modules[__package__].__path__)


def extension_path(name):
    """The path of extension module `name` (e.g. "_ortops") of the oga package, or None when the
    build did not make it."""
    for directory in package_directories():
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(directory, name + suffix)
            if os.path.isfile(path):
                return path
    return None
