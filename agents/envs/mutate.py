"""Bug injection by AST mutation (in the manner of SWE-smith).

A ``Mutation`` names one site in one function of a module and an operator:

- ``flip_comparison``: ``<`` <-> ``>=``, ``<=`` <-> ``>``, ``==`` <-> ``!=``, ``in`` <-> ``not in``,
  ``is`` <-> ``is not`` (one operator of one comparison);
- ``off_by_one``: an integer literal in arithmetic, an index/slice or a ``range`` call, +1;
- ``swap_arguments``: the first two positional arguments of a call;
- ``drop_statement``: one statement of a block that has more than one (not a return);
- ``wrong_constant``: ``True`` <-> ``False``, or an integer literal outside arithmetic
  replaced (0 -> 1, n -> 0).

Only the mutated node's source text is replaced (``ast.unparse`` of the new node), so the
rest of the file, comments included, stays byte-identical and the gold patch is small.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass
from typing import Iterator

OPERATORS = ("flip_comparison", "off_by_one", "swap_arguments", "drop_statement", "wrong_constant")
"""Mutation operators, in the order sites are enumerated."""

_FLIP = {ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.LtE: ast.Gt, ast.Gt: ast.LtE, ast.Eq: ast.NotEq,
         ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}


@dataclass(frozen=True)
class Mutation:
    """One bug: ``operator`` applied at the ``site``-th candidate node of ``function``.

    Attributes:
        path: module path relative to the project root.
        function: qualified name (``Class.method`` or ``func``).
        operator: one of ``OPERATORS``.
        site: index among that operator's candidate nodes in the function (walk order).
        line: 1-based line of the node (for messages and ordering).
    """

    path: str
    function: str
    operator: str
    site: int
    line: int

    @property
    def short_name(self) -> str:
        """The function's own name (last part of the qualified name)."""
        return self.function.rsplit(".", 1)[-1]


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef]]:
    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.FunctionDef]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield prefix + child.name, child  # type: ignore[misc]
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, prefix + child.name + ".")
    yield from walk(tree, "")


def _docstring_nodes(fn: ast.AST) -> set[int]:
    body = getattr(fn, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        return {id(body[0]), id(body[0].value)}
    return set()


def _is_int(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _int_contexts(fn: ast.AST) -> tuple[set[int], set[int]]:
    """ids of int literals in arithmetic/index/range positions, and of all int literals."""
    arith: set[int] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            arith |= {id(n) for n in (node.left, node.right) if _is_int(n)}
        elif isinstance(node, ast.Subscript):
            sl = node.slice
            parts = [sl.lower, sl.upper] if isinstance(sl, ast.Slice) else [sl]
            arith |= {id(n) for n in parts if n is not None and _is_int(n)}
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range":
            arith |= {id(n) for n in node.args if _is_int(n)}
    ints = {id(n) for n in ast.walk(fn) if _is_int(n)}
    return arith, ints


def _sites(fn: ast.AST, operator: str) -> list[ast.AST]:
    """Candidate nodes of ``operator`` in ``fn``, in ``ast.walk`` order (defaults and
    docstrings excluded)."""
    skip = _docstring_nodes(fn)
    args = getattr(fn, "args", None)
    if args is not None:
        skip |= {id(n) for d in [*args.defaults, *args.kw_defaults] if d is not None for n in ast.walk(d)}
    nodes = [n for n in ast.walk(fn) if id(n) not in skip and n is not fn]
    if operator == "flip_comparison":
        return [n for n in nodes if isinstance(n, ast.Compare) and type(n.ops[0]) in _FLIP]
    if operator == "swap_arguments":
        return [n for n in nodes if isinstance(n, ast.Call) and len(n.args) >= 2
                and not any(isinstance(a, ast.Starred) for a in n.args[:2])
                and ast.dump(n.args[0]) != ast.dump(n.args[1])]
    if operator == "drop_statement":
        out = []
        for n in [fn, *nodes]:
            for field in ("body", "orelse", "finalbody"):
                block = getattr(n, field, None)
                if isinstance(block, list) and len(block) > 1:
                    out += [s for s in block if isinstance(s, ast.stmt) and id(s) not in skip
                            and not isinstance(s, (ast.Return, ast.FunctionDef, ast.ClassDef,
                                                   ast.Pass, ast.Raise))]
        return out
    arith, ints = _int_contexts(fn)
    if operator == "off_by_one":
        return [n for n in nodes if id(n) in arith]
    if operator == "wrong_constant":
        return [n for n in nodes if isinstance(n, ast.Constant)
                and (type(n.value) is bool or (id(n) in ints and id(n) not in arith))]
    raise ValueError(f"unknown mutation operator {operator!r}; known: {', '.join(OPERATORS)}")


def enumerate_mutations(path: str, source: str) -> list[Mutation]:
    """All mutations of every function in one module, in file order.

    Args:
        path: module path relative to the project root (recorded in each Mutation).
        source: the module's text.
    """
    tree = ast.parse(source)
    out: list[Mutation] = []
    for qualname, fn in _functions(tree):
        for op in OPERATORS:
            for i, node in enumerate(_sites(fn, op)):
                out.append(Mutation(path, qualname, op, i, node.lineno))
    return out


def _offsets(source: str) -> list[int]:
    starts, pos = [0], 0
    for line in source.splitlines(keepends=True):
        pos += len(line)
        starts.append(pos)
    return starts


def apply_mutation(source: str, m: Mutation) -> str:
    """The module's text with mutation ``m`` applied (only the node's text changes).

    Raises:
        ValueError: the function or site does not exist in ``source``.
    """
    tree = ast.parse(source)
    fn = dict(_functions(tree)).get(m.function)
    if fn is None:
        raise ValueError(f"{m.path}: no function {m.function}")
    sites = _sites(fn, m.operator)
    if m.site >= len(sites):
        raise ValueError(f"{m.path}:{m.function}: no {m.operator} site {m.site}")
    node = sites[m.site]
    starts = _offsets(source)
    # ast offsets are in UTF-8 bytes within a line; convert through the line's bytes
    def pos(lineno: int, col: int) -> int:
        line = source[starts[lineno - 1]:starts[lineno]]
        return starts[lineno - 1] + len(line.encode("utf-8")[:col].decode("utf-8", errors="ignore"))

    if m.operator == "drop_statement":
        start, end = starts[node.lineno - 1], starts[node.end_lineno]  # whole lines
        return source[:start] + source[end:]
    new = copy.deepcopy(node)
    if m.operator == "flip_comparison":
        new.ops[0] = _FLIP[type(new.ops[0])]()
    elif m.operator == "swap_arguments":
        new.args[0], new.args[1] = new.args[1], new.args[0]
    elif m.operator == "off_by_one":
        new.value = node.value + 1
    elif type(node.value) is bool:
        new.value = not node.value
    else:
        new.value = 1 if node.value == 0 else 0
    start = pos(node.lineno, node.col_offset)
    end = pos(node.end_lineno, node.end_col_offset)
    return source[:start] + ast.unparse(new) + source[end:]
