"""Build of oga's extension oga._core (the Cython binding plus every C++ core source), of oga's
ONNX Runtime operator library oga._ortops (ortops/*.cpp), and of the device kernels (cuda/*.cu)
into oga/kernels.

The C API functions carry OGA_EXPORT (default visibility), so they stay exported from the
extension even though everything else is compiled with -fvisibility=hidden; ctypes can load the
extension (oga.library_path()) and call them.

Kernels: with nvcc present, each cuda/*.cu becomes PTX (compute_90) and an sm_90 cubin, compiled
while the extension compiles (cuda/build_kernels.py); without nvcc the build still succeeds and
oga.cuda_kernels compiles them with NVRTC at run time. A wheel also carries the kernel sources (for
NVRTC); an in-place or editable build leaves them in cuda/, where the loader finds them.
"""
import os
import shutil
import sys
from glob import glob

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, "cuda"))
import build_kernels  # noqa: E402  (cuda/build_kernels.py)


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



# oga's ONNX Runtime operators (ortops/): a shared library ONNX Runtime loads into sessions
# (SessionOptions.register_custom_ops_library), never imported by Python and never linked into the
# core. Built as an extension only so that setuptools compiles and installs it beside oga._core.
ortops = Extension(
    "oga._ortops",
    sources=_rel("ortops/*.cpp"),
    include_dirs=["ortops"],
    depends=_rel("ortops/*.h"),
    language="c++",
    extra_compile_args=compile_args,
)


class BuildExtAndKernels(build_ext):
    """build_ext, plus the kernels: nvcc runs alongside the C++ compiler."""

    def run(self):
        in_place = self.inplace or getattr(self, "editable_mode", False)
        out_dir = os.path.join(ROOT if in_place else self.build_lib, "oga", "kernels")
        if not in_place:
            shutil.rmtree(out_dir, ignore_errors=True)  # nothing stale from an earlier build
        kernels = build_kernels.KernelBuild(out_dir, log=lambda message: self.announce(message, level=2))
        kernels.start()
        try:
            super().run()
        except BaseException:
            kernels.finish(report=False)
            raise
        kernels.finish()
        if not in_place:
            build_kernels.copy_sources(out_dir)


setup(
    cmdclass={"build_ext": BuildExtAndKernels},
    ext_modules=cythonize(
        [core],
        language_level=3,
        compiler_directives={"embedsignature": True},
    ) + [ortops],
    # Compile the core's translation units in parallel.
    options={"build_ext": {"parallel": os.cpu_count() or 1}},
)
