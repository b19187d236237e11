"""Where oga's compiled libraries are: the extension modules beside the package's Python files
(oga/_ortops, oga/_native_executor), looked up along the package path, which also holds the
installed copy when a source checkout shadows it (see oga/__init__.py)."""
import importlib.machinery
import os


def extension_path(name):
    """The path of extension module `name` (e.g. "_ortops") of the oga package, or None when the
    build did not make it."""
    import oga

    for directory in oga.__path__:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(directory, name + suffix)
            if os.path.isfile(path):
                return path
    return None
