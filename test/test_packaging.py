"""Dependencies are what the code imports: nothing unused by default, nothing used undeclared.

An accelerator's toolchain (triton, about 1 GB) is an extra, `pip install 'kope[cuda]'`; a CPU
user never downloads it.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = ("kope_compiler", "passes", "memory", "targets")
# Distribution name -> the top-level module it installs, where the two differ.
IMPORT_NAME = {"torch-mlir": "torch_mlir", "scikit-learn": "sklearn"}


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].strip().lower()


def _imported_top_levels() -> set[str]:
    names: set[str] = set()
    for folder in PACKAGE_DIRS:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names.add(node.module.split(".")[0])
    return names


def test_every_default_dependency_is_imported_by_the_package() -> None:
    imported = _imported_top_levels()
    for requirement in _project()["dependencies"]:
        name = _name(requirement)
        assert IMPORT_NAME.get(name, name).replace("-", "_") in imported, (
            f"{requirement} is a default dependency that no module of kope imports"
        )


def test_every_third_party_import_is_declared() -> None:
    declared = {
        IMPORT_NAME.get(n, n).replace("-", "_") for n in map(_name, _project()["dependencies"])
    }
    third_party = {
        name
        for name in _imported_top_levels()
        if name not in sys.stdlib_module_names and name not in ("kope", "functorch", "__future__")
    }
    # Optional imports, each guarded where it is used and named in an extra or the README.
    # torch_npu is the NPU host's own (its PyPI builds pair with another torch than KOPE's):
    # only the kernel pack's runner imports it, there.
    optional = {"bpe_openai", "triton", "torch_npu", "ray", "matplotlib"}
    assert third_party - optional <= declared, sorted(third_party - optional - declared)


def test_accelerator_toolchains_are_extras() -> None:
    project = _project()
    defaults = {_name(r) for r in project["dependencies"]}
    assert "triton" not in defaults
    assert "triton" in {_name(r) for r in project["optional-dependencies"]["cuda"]}
    assert "triton-ascend" in {_name(r) for r in project["optional-dependencies"]["ascend"]}
    assert "ray" not in defaults
    assert "ray" in {_name(r) for r in project["optional-dependencies"]["ray"]}


def test_a_plain_install_holds_every_subpackage() -> None:
    """`pip install .` (not -e) installs only the packages listed: every folder of Python
    under a mapped root must be one of them, or the installed kope lacks it (as kope.agents
    once did)."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    found = set()
    for package, folder in setuptools["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((package, *relative)))
    assert found - listed == set(), "add these to [tool.setuptools] packages"
