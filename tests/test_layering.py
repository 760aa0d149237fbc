"""Imports run one way: down the floors of ``FLOORS``, never up, never sideways.

Every module of every part (a top-level package of the repository) is parsed with ``ast``;
every ``import`` and ``from ... import`` counts, at module level or inside a function, a
``TYPE_CHECKING`` block included (a type a part needs is still a dependency). A part may
import only parts on lower floors; two parts on one floor know nothing of each other.
Inside a part, modules import each other without a cycle.

``FLOORS`` is the one place the allowed direction is written; the README's "Layout"
section quotes it (``test_readme_layout_quotes_the_floors``).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

FLOORS: tuple[tuple[str, ...], ...] = (
    ("common",),
    ("sandbox", "router"),
    ("rollout",),
    ("agents",),
    ("rl",),
    ("bench",),
)
"""The parts from the bottom floor up. ``common``: entry points, config and options, exit
codes, URL checks, managed child processes, the request-metadata headers. ``sandbox`` and
``router``: the isolation of tool commands, and the router with its simulator; each stands
on ``common`` alone. ``rollout``: model calls, engines, weight sync. ``agents``: the agent
server and its episodes. ``rl``: the trainer, its rollout workers, rewards and evaluation.
``bench``: benchmarks over all of it."""

NOT_PARTS = {"tests"}


def _floor_of() -> dict[str, int]:
    return {part: i for i, parts in enumerate(FLOORS) for part in parts}


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of every part."""
    out = {}
    for init in sorted(REPO.glob("*/__init__.py")):
        part = init.parent.name
        if part in NOT_PARTS:
            continue
        for path in sorted(init.parent.rglob("*.py")):
            rel = path.relative_to(REPO).with_suffix("")
            if any(p.startswith(".") for p in rel.parts):
                continue
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports, each as the most specific module named."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in modules else stem for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _part(module: str) -> str:
    return module.partition(".")[0]


def test_every_part_has_a_floor():
    parts = {_part(m) for m in _modules()}
    missing = sorted(parts - set(_floor_of()))
    assert not missing, f"parts not in FLOORS (add each to its floor): {missing}"


def test_no_import_runs_up_or_sideways():
    floor = _floor_of()
    bad = sorted(
        f"{src} -> {dst}  ({_part(src)} floor {floor[_part(src)]}, {_part(dst)} floor {floor[_part(dst)]})"
        for src, targets in _graph().items()
        for dst in targets
        if _part(src) != _part(dst) and floor.get(_part(dst), -1) >= floor.get(_part(src), -1)
    )
    assert not bad, "imports that do not run down the floors:\n" + "\n".join(bad)


def test_no_two_parts_import_each_other():
    arrows = {(_part(s), _part(d)) for s, ts in _graph().items() for d in ts if _part(s) != _part(d)}
    both = sorted(f"{a} <-> {b}" for a, b in arrows if (b, a) in arrows and a < b)
    assert not both, "parts that import each other: " + ", ".join(both)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_cycle():
    # a -> b -> c -> a is one cycle; d -> a hangs off it and is no part of it.
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_cycle_inside_a_part():
    graph = _graph()
    by_part = defaultdict(dict)
    for src, targets in graph.items():
        by_part[_part(src)][src] = {t for t in targets if _part(t) == _part(src)}
    cycles = [c for part in sorted(by_part) for c in _cycles(by_part[part])]
    assert not cycles, "modules that import each other: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_readme_layout_quotes_the_floors():
    readme = (REPO / "README.md").read_text()
    layout = readme.partition("## Layout")[2].partition("\n## ")[0]
    quoted = "\n".join("  ".join(parts) for parts in reversed(FLOORS))
    assert quoted in layout, f"README.md's Layout section should list the floors, top first:\n{quoted}"
