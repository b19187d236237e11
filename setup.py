"""Build of oga's one extension, oga._core: the Cython binding plus every C++ core source.

The C API functions carry OGA_EXPORT (default visibility), so they stay exported from the
extension even though everything else is compiled with -fvisibility=hidden; ctypes can load the
extension (oga.library_path()) and call them.
"""
import os
import sys
from glob import glob

from Cython.Build import cythonize
from setuptools import Extension, setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def _rel(pattern):
    # setuptools wants paths relative to setup.py; sorted for reproducible builds.
    return sorted(os.path.relpath(p, ROOT) for p in glob(os.path.join(ROOT, pattern)))


compile_args = ["-std=c++17", "-O2", "-fvisibility=hidden", "-fno-strict-aliasing"]
# Python's own CFLAGS carry -g; skip debug info unless asked for (OGA_DEBUG=1: -O0 -g).
compile_args += ["-O0", "-g"] if os.environ.get("OGA_DEBUG") == "1" else ["-g0"]
link_args = []
# dlopen of llguidance (guidance.cpp); libdl is part of libc from glibc 2.34 on.
libraries = ["dl"] if sys.platform.startswith("linux") else []
if sys.platform == "darwin":
    compile_args.append("-mmacosx-version-min=10.15")

core = Extension(
    "oga._core",
    sources=["oga/_core.pyx"] + _rel("src/*.cpp"),
    include_dirs=["include", "src"],
    depends=_rel("include/oga/*.h") + _rel("src/*.h") + ["oga/_core.pxd"],
    language="c++",
    extra_compile_args=compile_args,
    extra_link_args=link_args,
    libraries=libraries,
)

setup(
    ext_modules=cythonize(
        [core],
        language_level=3,
        compiler_directives={"embedsignature": True},
    ),
    # Compile the core's translation units in parallel.
    options={"build_ext": {"parallel": os.cpu_count() or 1}},
)
