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

Sanitizers: OGA_SANITIZE=address,undefined (any list -fsanitize= takes) builds oga._core with those
sanitizers in its compile and link arguments, plus -fno-omit-frame-pointer and
-fno-sanitize-recover=all (the first report ends the process, so undefined behaviour fails a run),
-O1 and line tables for readable reports, -fno-wrapv (Python's CFLAGS define signed overflow,
which would hide it from UBSan), and libstdc++'s assertions (-D_GLIBCXX_ASSERTIONS; with
address also its vector annotations, -D_GLIBCXX_SANITIZE_VECTOR=1). oga._ortops is left out of a
sanitized build: it is only loaded into ONNX Runtime sessions, and the sanitized runs (.ci/sanitize)
drive the core through the test executor without ONNX Runtime. Python is not sanitized, so a process
that imports the sanitized core must preload the runtime:
LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)" (libstdc++
too, or ASan aborts at the first C++ throw) and ASAN_OPTIONS=detect_leaks=0 (CPython leaks by
design). Build it away from the in-place extension (in a copy of the tree, as .ci/sanitize does).
"""
import concurrent.futures
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

sanitize = os.environ.get("OGA_SANITIZE", "").strip()
core_compile_args, core_link_args = list(compile_args), list(link_args)
if sanitize:
    sanitizer_args = [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all"]
    # Later -O/-g win over Python's CFLAGS and the ones above: -O1 keeps the instrumented build
    # quick to compile and run, -g1 gives the reports file:line frames. libstdc++'s assertions catch
    # what ASan cannot see (an index past size() but within capacity(), front() of an empty vector);
    # with ASan, its vector annotations report reads of a vector's unused capacity.
    # Python's CFLAGS carry -fwrapv, which defines signed overflow and so hides it from UBSan:
    # -fno-wrapv brings the check back (an overflow is a bug here, wrapped or not).
    core_compile_args += sanitizer_args + ["-O1", "-g1", "-fno-wrapv", "-D_GLIBCXX_ASSERTIONS"]
    if "address" in sanitize.split(","):
        core_compile_args.append("-D_GLIBCXX_SANITIZE_VECTOR=1")
    core_link_args += sanitizer_args

core = Extension(
    "oga._core",
    sources=["oga/_core.pyx"] + _rel("src/*/*.cpp"),
    include_dirs=["include", "src"],
    depends=_rel("include/oga/*.h") + _rel("src/*/*.h") + ["oga/_core.pxd"] + _rel("oga/*.pxi"),
    language="c++",
    extra_compile_args=core_compile_args,
    extra_link_args=core_link_args,
    libraries=libraries,
)



# oga's ONNX Runtime operators (ortops/): a shared library ONNX Runtime loads into sessions
# (SessionOptions.register_custom_ops_library), never imported by Python and never linked into the
# core. Built as an extension only so that setuptools compiles and installs it beside oga._core.
ortops = Extension(
    "oga._ortops",
    sources=_rel("ortops/*.cpp"),
    # src/ for the header-only block maxima loop the LM head shares with greedy selection
    include_dirs=["ortops", "src"],
    depends=_rel("ortops/*.h") + ["src/sampling/block_max.h"],
    language="c++",
    extra_compile_args=compile_args,
)

# oga's native ONNX Runtime executor (native_executor/): an OgaExtModelExecutor over ONNX Runtime's C
# API, loaded by oga/executor/native.py with ctypes (it dlopens the onnxruntime wheel's
# libonnxruntime.so itself); never linked into the core. Left out of a sanitized build like
# oga._ortops (the sanitized runs drive the core without ONNX Runtime).
native_executor = Extension(
    "oga._native_executor",
    sources=_rel("native_executor/*.cpp"),
    include_dirs=["native_executor", "ortops", "include"],
    depends=_rel("native_executor/*.h") + ["ortops/ort_api.h", "include/oga/oga_ext.h", "include/oga/oga.h"],
    language="c++",
    extra_compile_args=compile_args,
    libraries=libraries,
)


def _compile_files_in(pool, compiler):
    """Makes `compiler.compile` compile an extension's translation units side by side in `pool`.
    setuptools' `parallel` option only builds extensions side by side, and oga._core alone is ~50
    units. The same steps as distutils' CCompiler.compile, with the per-file loop in the pool."""

    def compile(sources, output_dir=None, macros=None, include_dirs=None, debug=False, extra_preargs=None,
                extra_postargs=None, depends=None):
        macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)
        jobs = [pool.submit(compiler._compile, obj, *build[obj], cc_args, extra_postargs, pp_opts)
                for obj in objects if obj in build]
        for job in jobs:
            job.result()  # raises the first failure in source order
        return objects

    compiler.compile = compile


class BuildExtAndKernels(build_ext):
    """build_ext, plus the kernels: nvcc runs alongside the C++ compiler."""

    def build_extensions(self):
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            _compile_files_in(pool, self.compiler)
            super().build_extensions()

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
    ) + ([] if sanitize else [ortops, native_executor]),
    # The extensions side by side (their translation units too: BuildExtAndKernels).
    options={"build_ext": {"parallel": os.cpu_count() or 1}},
)
