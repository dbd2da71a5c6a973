"""The version has one source, VERSION: the installed package reports it (pyproject.toml reads it
through scikit-build-core's regex provider; CMakeLists.txt reads it for the CLI, whose ctest
cli.version checks `moekit --version`). The torch the extension was built against is recorded
(moekit/_build_info.py) and checked at import (moekit._ops.torch_mismatch)."""

import os

import moekit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_installed_version_is_the_version_file():
    with open(os.path.join(ROOT, "VERSION")) as f:
        assert moekit.__version__ == f.read().strip()


def test_torch_version_recorded_at_build_and_checked():
    import torch
    from moekit import _build_info, _ops
    assert _build_info.TORCH_VERSION == torch.__version__
    assert _ops.loaded and _ops.load_error is None
    assert _ops.torch_mismatch(torch.__version__, torch.__version__) is None


def test_torch_mismatch_message(monkeypatch):
    from moekit import _ops
    monkeypatch.delenv("MOEKIT_SKIP_TORCH_CHECK", raising=False)
    msg = _ops.torch_mismatch("2.11.0+cu130", "2.15.0+cpu")
    assert "built against torch 2.11.0+cu130, but this is torch 2.15.0+cpu" in msg
    assert "pip install --force-reinstall --no-deps ." in msg
    monkeypatch.setenv("MOEKIT_SKIP_TORCH_CHECK", "1")
    assert _ops.torch_mismatch("2.11.0+cu130", "2.15.0+cpu") is None
