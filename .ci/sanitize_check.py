"""pytest plugin of the sanitizer stage (.ci/sanitize, loaded with -p sanitize_check): the run must
import the sanitized oga._core that the stage built (OGA_SANITIZED_CORE), not an installed or
in-place one; the closing lines name it and say whether ONNX Runtime was loaded, which the stage's
tests (the core through the test executor and the C ABI) should not need."""
import os
import sys

import pytest


def _core_path():
    import oga._core

    return os.path.realpath(oga._core.__file__)


def pytest_configure(config):
    expected = os.environ.get("OGA_SANITIZED_CORE")
    if not expected:
        raise pytest.UsageError("sanitize_check: OGA_SANITIZED_CORE is not set")
    found = _core_path()
    if found != os.path.realpath(expected):
        raise pytest.UsageError(f"sanitize_check: the run imports {found}, not {expected}")
    config._sanitize_check_core = found


def pytest_report_header(config):
    return f"sanitized oga._core: {config._sanitize_check_core}"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    terminalreporter.write_line(f"sanitized oga._core: {config._sanitize_check_core}")
    loaded = "onnxruntime" in sys.modules
    terminalreporter.write_line(f"onnxruntime imported during the run: {'yes' if loaded else 'no'}")
