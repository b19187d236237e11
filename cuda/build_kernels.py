"""Build-time compilation of the kernels in this directory, used by setup.py (and runnable alone:
``python cuda/build_kernels.py OUT_DIR``).

With nvcc (found on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin; $OGA_NVCC names one, or 0 to
skip it) every ``*.cu`` becomes ``<name>.ptx`` (compute_90) and ``<name>.cubin`` (sm_90) in the
output directory, all compiled concurrently with warnings as errors: a kernel that nvcc rejects
fails the build. Without nvcc nothing is compiled and the package relies on NVRTC at run time
(oga/cuda_kernels.py). The sources (``*.cu``, ``*.cuh``) can be copied along, so an installed
package can still compile them with NVRTC.
"""
import glob
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ARCH = 90
MIN_NVCC = (11, 8)  # the first nvcc that knows sm_90


def kernel_sources(directory=HERE):
    return sorted(glob.glob(os.path.join(directory, "*.cu")))


def find_nvcc():
    """The nvcc to use, or None."""
    chosen = os.environ.get("OGA_NVCC")
    if chosen is not None:
        return None if chosen in ("", "0") else chosen
    candidates = [shutil.which("nvcc")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates.append(os.path.join(home, "bin", "nvcc"))
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def nvcc_version(nvcc):
    """(major, minor) of `nvcc`, or None when it does not run."""
    try:
        output = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release (\d+)\.(\d+)", output)
    return (int(match.group(1)), int(match.group(2))) if match else None


def copy_sources(out_dir, source_dir=HERE):
    """Copies the kernel sources (what NVRTC needs at run time) into `out_dir`."""
    os.makedirs(out_dir, exist_ok=True)
    for path in sorted(glob.glob(os.path.join(source_dir, "*.cu")) + glob.glob(os.path.join(source_dir, "*.cuh"))):
        shutil.copyfile(path, os.path.join(out_dir, os.path.basename(path)))


class KernelBuild:
    """nvcc runs started by start() and collected by finish(), so setup.py can compile the C++
    extension meanwhile."""

    def __init__(self, out_dir, source_dir=HERE, nvcc="auto", log=print):
        self.out_dir = out_dir
        self.source_dir = source_dir
        self.nvcc = find_nvcc() if nvcc == "auto" else nvcc
        self.log = log
        self.processes = []
        self.skipped = None  # why nvcc did not run, when it did not

    def start(self):
        if self.nvcc is None:
            self.skipped = "nvcc not found: the kernels will be compiled with NVRTC at run time"
            self.log(f"oga kernels: {self.skipped}")
            return self
        version = nvcc_version(self.nvcc)
        if version is None or version < MIN_NVCC:
            found = "does not run" if version is None else f"is CUDA {version[0]}.{version[1]}"
            self.skipped = (f"{self.nvcc} {found}; sm_90 needs {MIN_NVCC[0]}.{MIN_NVCC[1]} or newer: the kernels will "
                            "be compiled with NVRTC at run time")
            self.log(f"oga kernels: {self.skipped}")
            return self
        os.makedirs(self.out_dir, exist_ok=True)
        common = [self.nvcc, "-std=c++17", "-Werror", "all-warnings", f"-I{self.source_dir}"]
        for source in kernel_sources(self.source_dir):
            name = os.path.splitext(os.path.basename(source))[0]
            for kind, arch in (("ptx", f"compute_{ARCH}"), ("cubin", f"sm_{ARCH}")):
                output = os.path.join(self.out_dir, f"{name}.{kind}")
                command = common + [f"--{kind}", f"-arch={arch}", source, "-o", output]
                self.log(" ".join(command))
                self.processes.append(
                    (command, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
        return self

    def finish(self, report=True):
        """Waits for every nvcc run; raises RuntimeError with nvcc's output if one failed (unless
        `report` is false: the build already failed for another reason)."""
        failures = []
        for command, process in self.processes:
            output, _ = process.communicate()
            if process.returncode != 0:
                failures.append(f"{' '.join(command)}\n{output}")
        self.processes = []
        if failures and report:
            raise RuntimeError("nvcc failed on the oga kernels:\n" + "\n".join(failures))
        return self


def main(argv):
    if len(argv) != 2:
        print(f"usage: {argv[0]} OUT_DIR", file=sys.stderr)
        return 2
    KernelBuild(argv[1]).start().finish()
    copy_sources(argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
