"""The version has one source, VERSION: the installed package reports it (pyproject.toml reads it
through scikit-build-core's regex provider; CMakeLists.txt reads it for the CLI, whose ctest
cli.version checks `moekit --version`)."""

import os

import moekit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_installed_version_is_the_version_file():
    with open(os.path.join(ROOT, "VERSION")) as f:
        assert moekit.__version__ == f.read().strip()
