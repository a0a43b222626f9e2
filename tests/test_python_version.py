"""pyproject's requires-python and the README name the lowest Python the installed code imports on.

The floor is not written down here: it is found by reading the source of the packages pyproject
installs for names and syntax whose first Python version is known (today ``typing.Self``, 3.11, in
operators/image_face_filter.py and operators/image_skin_tone.py). A requires-python that admits an
older Python lets pip install the project where its first import fails; one above the floor turns
away interpreters that would work. Using a newer feature not in the tables below: add it there.
"""

from __future__ import annotations

from helpers import REPO_ROOT
import ast
import re
import sys
import tomllib
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = REPO_ROOT

# (module, name) -> the first Python version that has it, for `from module import name` and `module.name`
ADDED = {
    **{("typing", n): (3, 10) for n in ("ParamSpec", "Concatenate", "TypeAlias", "TypeGuard", "is_typeddict")},
    **{("typing", n): (3, 11) for n in ("Self", "LiteralString", "Never", "assert_never", "assert_type", "reveal_type",
                                        "TypeVarTuple", "Unpack", "Required", "NotRequired", "dataclass_transform",
                                        "get_overloads", "clear_overloads")},
    **{("typing", n): (3, 12) for n in ("override", "TypeAliasType")},
    **{("typing", n): (3, 13) for n in ("ReadOnly", "TypeIs", "NoDefault", "get_protocol_members", "is_protocol")},
    ("itertools", "pairwise"): (3, 10), ("itertools", "batched"): (3, 12),
    ("enum", "StrEnum"): (3, 11), ("datetime", "UTC"): (3, 11), ("hashlib", "file_digest"): (3, 11),
    ("contextlib", "chdir"): (3, 11), ("asyncio", "TaskGroup"): (3, 11), ("asyncio", "timeout"): (3, 11),
}
MODULES = {"tomllib": (3, 11), "zoneinfo": (3, 9), "graphlib": (3, 9)}
BUILTINS = {"aiter": (3, 10), "anext": (3, 10), "ExceptionGroup": (3, 11), "BaseExceptionGroup": (3, 11)}
SYNTAX = {"Match": (3, 10), "TryStar": (3, 11), "TypeAlias": (3, 12)}  # ast node class names


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def installed_sources() -> list[Path]:
    """The .py files of the packages pyproject installs."""
    from setuptools import find_packages

    include = pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = find_packages(str(ROOT), include=include)
    assert {"operators", "operators.support", "pipelines.engine", "pipelines.studies.amplification"} <= set(packages)
    files = [f for p in packages for f in sorted((ROOT / p.replace(".", "/")).glob("*.py"))]
    assert files, packages
    return files


def features(path: Path) -> list[tuple[tuple[int, int], str]]:
    """(first version, what) for each version-bound feature ``path`` uses."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        kind = type(node).__name__
        if kind in SYNTAX:
            found.append((SYNTAX[kind], f"{kind} syntax"))
        elif isinstance(node, ast.ImportFrom) and node.module:
            found += [(ADDED[node.module, a.name], f"{node.module}.{a.name}") for a in node.names
                      if (node.module, a.name) in ADDED]
            if node.module.split(".")[0] in MODULES:
                found.append((MODULES[node.module.split(".")[0]], node.module))
        elif isinstance(node, ast.Import):
            found += [(MODULES[a.name.split(".")[0]], a.name) for a in node.names if a.name.split(".")[0] in MODULES]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and (node.value.id, node.attr) in ADDED:
            found.append((ADDED[node.value.id, node.attr], f"{node.value.id}.{node.attr}"))
        elif isinstance(node, ast.Name) and node.id in BUILTINS:
            found.append((BUILTINS[node.id], node.id))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and getattr(node, "type_params", None):
            found.append(((3, 12), "type parameter syntax"))
    return found


def code_floor() -> tuple[tuple[int, int], list[str]]:
    """The lowest Python 3 the installed code needs, and where each feature at that version is used."""
    uses = [(v, f"{what} in {path.relative_to(ROOT)}") for path in installed_sources() for v, what in features(path)]
    floor = max((v for v, _ in uses), default=(3, 0))
    return floor, sorted({where for v, where in uses if v == floor})


def lowest_admitted(spec: SpecifierSet) -> tuple[int, int] | None:
    for minor in range(0, 40):
        if any(spec.contains(Version(f"3.{minor}.{patch}")) for patch in (0, 99)):
            return 3, minor
    return None


def test_requires_python_is_the_lowest_python_the_code_imports_on():
    floor, where = code_floor()
    assert floor >= (3, 11) and any("typing.Self" in w for w in where), (floor, where)  # the issue's own finding
    spec = SpecifierSet(pyproject()["project"]["requires-python"])
    assert lowest_admitted(spec) == floor, (
        f"requires-python {spec} admits Python {lowest_admitted(spec)}, the code needs {floor} ({'; '.join(where)})")
    assert spec.contains(Version("{}.{}.{}".format(*sys.version_info[:3])))  # and the Python the tests run on


def test_readme_names_the_same_python():
    floor, _ = code_floor()
    readme = (ROOT / "README.md").read_text()
    named = set(re.findall(r"\b[Pp]ython ?(3\.\d+)\b", readme))
    assert named, "the README says which Python to use"
    assert named == {"{}.{}".format(*floor)}, named
