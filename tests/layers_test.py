"""The layers of docs/architecture.md, enforced: every module imports only from its own layer or the layers below,
no import cycle (imports inside functions and under ``TYPE_CHECKING`` included), no private name of another
module, and a tool (each quantize mode, ``quantization.int8``..., is one) imports another tool only through the
names its package's ``__all__`` exports.

The modules are read as source (``ast``), not imported, so this test is fast and sees every import.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "onnxprec"

# The layers of docs/architecture.md, lowest first; a module may import from its own layer and those below.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("onnxprec", "onnxprec.errors", "onnxprec._graph", "onnxprec._ops", "onnxprec._options",
              "onnxprec._arg_groups",
              "onnxprec._lazy_sympy", "onnxprec._exports", "onnxprec._progress",
              "onnxprec._html", "onnxprec._array")),
    ("I/O", ("onnxprec._io", "onnxprec._protobuf", "onnxprec._tensors", "onnxprec._report", "onnxprec._genai",
             "onnxprec._tool")),
    ("runtime", ("onnxprec._ort", "onnxprec._ort_profile", "onnxprec._latency")),
    ("measure", ("onnxprec.calibration", "onnxprec.calibration_data", "onnxprec.llm_inputs",
                 "onnxprec._input_contracts", "onnxprec._pieces", "onnxprec.reference", "onnxprec.segments",
                 "onnxprec.reductions",
                 "onnxprec._packed_tables", "onnxprec.observers",
                 "onnxprec.metrics", "onnxprec.validate", "onnxprec.sensitivity", "onnxprec.accuracy")),
    ("passes", ("onnxprec.passes",)),
    ("tools", ("onnxprec.autocast", "onnxprec.quantization", "onnxprec.debug", "onnxprec.evaluate",
               "onnxprec.preprocess", "onnxprec.export")),
    ("CLI", ("onnxprec.cli", "*._cli", "*.__main__")),
    ("test helpers", ("onnxprec._testing", "onnxprec.quantization._testing")),
)  # fmt: skip


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name.endswith("_test.py"):
            continue
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of a module: the most specific pattern that names it or a package above it."""
    best: tuple[int, int] | None = None  # (specificity, layer)
    for index, (_, patterns) in enumerate(LAYERS):
        for pattern in patterns:
            if pattern.startswith("*."):  # a module name in any package, e.g. every tool's _cli
                hit, specificity = module.endswith(pattern[1:]), 1000
            elif pattern == "onnxprec":  # the package itself, not everything in it
                hit, specificity = module == pattern, 0
            else:  # a module or a package and everything in it
                hit, specificity = module == pattern or module.startswith(pattern + "."), pattern.count(".")
            if hit and (best is None or specificity > best[0]):
                best = (specificity, index)
    if best is None:
        raise AssertionError(f"module {module} is in no layer: add it to LAYERS here and to docs/architecture.md.")
    return best[1]


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int
    names: tuple[str, ...]


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for _ in range(node.level - 1):
        package = package.rsplit(".", 1)[0]
    return f"{package}.{node.module}" if node.module else package


@functools.cache
def _tree(module: str) -> ast.Module:
    path = MODULES[module]
    return ast.parse(path.read_text(), str(path))


@functools.cache
def imports_of(module: str) -> list[Import]:
    """Every import of onnxprec modules in ``module``: top level, in functions and under ``TYPE_CHECKING``.

    ``from package import name`` counts as an import of ``package.name`` when that is a module.
    """
    path = MODULES[module]
    found = []
    for node in ast.walk(_tree(module)):
        if isinstance(node, ast.Import):
            found += [Import(module, a.name, node.lineno, ()) for a in node.names if a.name.startswith("onnxprec")]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, path, node)
            if base != "onnxprec" and not base.startswith("onnxprec."):
                continue
            plain = []
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:
                    found.append(Import(module, f"{base}.{alias.name}", node.lineno, ()))
                else:
                    plain.append(alias.name)
            if plain:
                found.append(Import(module, base, node.lineno, tuple(plain)))
    return found


def test_every_module_is_in_a_layer() -> None:
    for module in MODULES:
        layer_of(module)
    with pytest.raises(AssertionError, match="is in no layer"):
        layer_of("onnxprec._new_module")


def test_no_module_imports_from_a_layer_above_it() -> None:
    problems = []
    for module in MODULES:
        own = layer_of(module)
        for imp in imports_of(module):
            if imp.target not in MODULES:
                continue
            theirs = layer_of(imp.target)
            if theirs > own:
                problems.append(
                    f"{MODULES[module].relative_to(SRC)}:{imp.line}: {module} ({LAYERS[own][0]}) imports "
                    f"{imp.target} ({LAYERS[theirs][0]}), a layer above it"
                )
    assert not problems, "\n".join(problems)


def _graph() -> dict[str, set[str]]:
    """Module -> the modules it imports, without the edges to its own packages (Python imports those first)."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module in MODULES:
        for imp in imports_of(module):
            if imp.target in MODULES and not module.startswith(imp.target + ".") and imp.target != module:
                graph[module].add(imp.target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (as the modules along it, the first repeated at the end), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_no_import_cycles() -> None:
    cycle = find_cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_find_cycle_finds_a_type_checking_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_private_names_of_other_modules() -> None:
    """``from onnxprec.x import _name`` and ``x._name`` reach into another module: make the name public there."""
    problems = []
    for module, path in MODULES.items():
        tree = _tree(module)
        aliases = {}
        for imp in imports_of(module):
            problems += [
                f"{path.relative_to(SRC)}:{imp.line}: imports private {imp.target}.{n}"
                for n in imp.names
                if n.startswith("_") and not n.startswith("__")
            ]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _resolve(module, path, node)
                for alias in node.names:
                    if f"{base}.{alias.name}" in MODULES:
                        aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in MODULES and alias.asname:
                        aliases[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and f"{aliases[node.value.id]}.{node.attr}" not in MODULES
            ):
                problems.append(
                    f"{path.relative_to(SRC)}:{node.lineno}: uses private {aliases[node.value.id]}.{node.attr}"
                )
    assert not problems, "\n".join(sorted(set(problems)))


# Each quantize mode (a package of onnxprec.quantization with its own pipeline, ``_api``: int4, int8, fp8...) is a
# tool of its own: FP8 builds on INT8 through what INT8 exports, as any later mode will.
QUANTIZE_MODES = tuple(
    f"onnxprec.quantization.{path.parent.name}" for path in sorted((PACKAGE / "quantization").glob("*/_api.py"))
)
TOOLS = (*dict(LAYERS)["tools"], *QUANTIZE_MODES)


def tool_of(module: str) -> str | None:
    """The tool package (``onnxprec.autocast``, ``onnxprec.quantization.int8``...) a module belongs to (the most
    specific), or None outside every tool."""
    owners = [tool for tool in TOOLS if module == tool or module.startswith(tool + ".")]
    return max(owners, key=len, default=None)


@functools.cache
def exported(module: str) -> frozenset[str]:
    """The names in a module's ``__all__`` (a package's: its ``__init__``), read from the source."""
    for node in _tree(module).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return frozenset(ast.literal_eval(node.value))
    return frozenset()


def outside_all(imp: Import) -> str | None:
    """Why ``imp``, made by a module of one tool, reaches into another tool's internals (None if it does not): it
    must import the other tool's package (or module, for a one-module tool) and only names of its ``__all__``."""
    own, theirs = tool_of(imp.source), tool_of(imp.target)
    if theirs is None or theirs == own or (own or "").startswith(theirs + "."):
        return None  # its own tool, or the package it is a mode of (the quantizers' shared base)
    if imp.target != theirs:
        return f"imports {imp.target}, inside the tool {theirs}: import what {theirs}'s __all__ exports"
    hidden = sorted(set(imp.names) - exported(theirs))
    return f"imports {', '.join(hidden)} from {theirs}, not in its __all__" if hidden else None


def test_tools_import_each_other_only_through_all() -> None:
    """A tool's modules are its own: another tool uses what its package exports (``from onnxprec.autocast import
    convert_model``), never ``onnxprec.autocast.target``; what several tools share belongs to a lower layer."""
    problems = [
        f"{MODULES[module].relative_to(SRC)}:{imp.line}: {why}"
        for module in MODULES
        if LAYERS[layer_of(module)][0] == "tools"
        for imp in imports_of(module)
        if (why := outside_all(imp))
    ]
    assert not problems, "\n".join(problems)


def test_the_all_rule_sees_internals_and_hidden_names() -> None:
    source = "onnxprec.quantization.int8._api"
    assert outside_all(Import(source, "onnxprec.autocast", 1, ("convert_model",))) is None
    assert outside_all(Import(source, "onnxprec.quantization.int8.decide", 1, ("anything",))) is None  # its own tool
    assert "not in its __all__" in (outside_all(Import(source, "onnxprec.quantization.int4", 1, ("anything",))) or "")
    assert "inside the tool onnxprec.autocast" in (outside_all(Import(source, "onnxprec.autocast.target", 1, ())) or "")
    assert "not in its __all__" in (outside_all(Import(source, "onnxprec.autocast", 1, ("masks_of",))) or "")
    # a quantize mode is a tool of its own: FP8 reaches INT8 through its __all__, the shared quantizer base is no mode
    assert {"onnxprec.quantization.int4", "onnxprec.quantization.int8", "onnxprec.quantization.fp8"} <= set(TOOLS)
    fp8 = "onnxprec.quantization.fp8._api"
    assert "inside the tool onnxprec.quantization.int8" in (
        outside_all(Import(fp8, "onnxprec.quantization.int8._api", 1, ())) or ""
    )
    assert outside_all(Import(fp8, "onnxprec.quantization.int8", 1, ("quantize_model",))) is None
    assert outside_all(Import(fp8, "onnxprec.quantization._tool", 1, ("QuantizationTool",))) is None


@pytest.mark.parametrize(
    ("module", "layer"),
    [("onnxprec._options", "base"), ("onnxprec.autocast._cli", "CLI"), ("onnxprec.autocast._api", "tools"),
     ("onnxprec.passes.name_nodes", "passes"), ("onnxprec.debug.__main__", "CLI"), ("onnxprec._report", "I/O"),
     ("onnxprec", "base"), ("onnxprec.__main__", "CLI"), ("onnxprec.accuracy", "measure")],
)  # fmt: skip
def test_layer_map(module: str, layer: str) -> None:
    assert LAYERS[layer_of(module)][0] == layer
