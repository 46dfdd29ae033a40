"""The mistakes students make that cosmic-ray's own operators do not: a plugin of the engine
(`course/...` operators, registered under cosmic-ray's `cosmic_ray.operator_providers`
entry point in pyproject.toml, and in process by course/tools/author/mutate.py).

- DeleteStatement: a call or an update left out (a `barrier()`, a `set_state_dict(...)`,
  `x += y`, `self.step = n`): the statement becomes `pass`.
- DropCall: a method call without arguments left off an expression (a `.clone()`, a
  `.contiguous()`, a `.wait()` whose result is used).
- DropKeyword: one keyword argument left out of a call (`timeout=`, `group=`, `dim=`).
- SwapArguments: two neighbouring positional arguments given in the wrong order.

Each works on cosmic-ray's parso trees: the new node is parsed from the new code, with the
old node's leading whitespace and comments kept.
"""

from __future__ import annotations

import parso
from cosmic_ray.operators.operator import Example, Operator


def _parsed(code: str, like):
    """The expression or trailer parsed from `code`, with `like`'s prefix."""
    node = parso.parse(code).children[0]
    while node.type == "simple_stmt":
        node = node.children[0]
    node.get_first_leaf().prefix = like.get_first_leaf().prefix
    return node


def _is_call(trailer) -> bool:
    return trailer.type == "trailer" and trailer.children[0].value == "("


def _arguments(trailer) -> list:
    """The argument nodes of a call's trailer `( ... )`."""
    inner = trailer.children[1:-1]
    if not inner:
        return []
    if inner[0].type == "arglist":
        return [c for c in inner[0].children if c.type != "operator" or c.value != ","]
    return [inner[0]]


def _is_keyword(arg) -> bool:
    return arg.type == "argument" and len(arg.children) == 3 and arg.children[1].value == "="


def _is_positional(arg) -> bool:
    starred = arg.type == "argument" and arg.children[0].type == "operator"
    return not _is_keyword(arg) and not starred and arg.type != "argument"


def _distinct(a, b) -> bool:
    """Two positional arguments whose swap changes the call."""
    return _is_positional(a) and _is_positional(b) and a.get_code().strip() != b.get_code().strip()


def _call_with(trailer, args: list):
    code = "f(" + ", ".join(a.get_code().strip() for a in args) + ")"
    atom = parso.parse(code).children[0]
    while atom.type == "simple_stmt":
        atom = atom.children[0]
    new = atom.children[1]  # f's trailer
    new.get_first_leaf().prefix = trailer.get_first_leaf().prefix
    return new


class DeleteStatement(Operator):
    """A call made for its effect, an augmented assignment, or an assignment to an attribute
    or an element, replaced by `pass`."""

    def mutation_positions(self, node):
        if node.parent is None or node.parent.type != "simple_stmt" or node.type == "newline":
            return
        if len([c for c in node.parent.children if c.type != "operator"]) != 2:
            return  # several statements on one line: left alone
        call = node.type == "atom_expr" and _is_call(node.children[-1])
        update = node.type == "expr_stmt" and (
            getattr(node.children[1], "value", "=") != "="  # x += y (not x: T = y)
            or (node.children[0].type == "atom_expr"
                and node.children[0].children[-1].type == "trailer")
        )  # fmt: skip
        if call or update:
            yield node.start_pos, node.end_pos

    def mutate(self, node, index):
        return parso.python.tree.Keyword("pass", node.start_pos, node.get_first_leaf().prefix)

    @classmethod
    def examples(cls):
        return (
            Example("dist.barrier()\n", "pass\n"),
            Example("self.total += x\n", "pass\n"),
            Example("buf[i] = x\n", "pass\n"),
            Example("model.load_state_dict(state)\n", "pass\n"),
        )


class DropCall(Operator):
    """`x.clone()` inside an expression becomes `x`: a method call with no arguments dropped."""

    def mutation_positions(self, node):
        if node.type != "atom_expr" or len(node.children) < 3:
            return
        if node.parent is not None and node.parent.type == "simple_stmt":
            return  # a statement: DeleteStatement's
        name, call = node.children[-2:]
        if name.type == "trailer" and name.children[0].value == "." and _is_call(call):
            if not _arguments(call):
                yield node.start_pos, node.end_pos

    def mutate(self, node, index):
        return _parsed("".join(c.get_code() for c in node.children[:-2]).strip(), node)

    @classmethod
    def examples(cls):
        return (
            Example("y = x.clone()\n", "y = x\n"),
            Example("y = f(a).detach().clone()\n", "y = f(a).detach()\n"),
        )


class DropKeyword(Operator):
    """One keyword argument left out of a call."""

    def mutation_positions(self, node):
        if _is_call(node):
            for arg in _arguments(node):
                if _is_keyword(arg):
                    yield arg.start_pos, arg.end_pos

    def mutate(self, node, index):
        keywords = [a for a in _arguments(node) if _is_keyword(a)]
        return _call_with(node, [a for a in _arguments(node) if a is not keywords[index]])

    @classmethod
    def examples(cls):
        return (
            Example("dist.init_process_group('gloo', timeout=t)\n",
                    "dist.init_process_group('gloo')\n"),
            Example("f(a, dim=0, keepdim=True)\n", "f(a, keepdim=True)\n", occurrence=0),
            Example("f(a, dim=0, keepdim=True)\n", "f(a, dim=0)\n", occurrence=1),
        )  # fmt: skip


class SwapArguments(Operator):
    """Two neighbouring positional arguments of a call swapped."""

    def mutation_positions(self, node):
        if _is_call(node):
            args = _arguments(node)
            for a, b in zip(args, args[1:], strict=False):
                if (
                    _is_positional(a)
                    and _is_positional(b)
                    and a.get_code().strip() != b.get_code().strip()
                ):
                    yield a.start_pos, b.end_pos  # fmt: skip

    def mutate(self, node, index):
        args = _arguments(node)
        pairs = [i for i, (a, b) in enumerate(zip(args, args[1:], strict=False)) if _distinct(a, b)]
        i = pairs[index]
        return _call_with(node, [*args[:i], args[i + 1], args[i], *args[i + 2 :]])

    @classmethod
    def examples(cls):
        return (
            Example("dist.send(x, dst)\n", "dist.send(dst, x)\n"),
            Example("f(a, b, c)\n", "f(a, c, b)\n", occurrence=1),
        )


OPERATORS = {op.__name__: op for op in (DeleteStatement, DropCall, DropKeyword, SwapArguments)}


class Provider:
    """cosmic-ray's operator provider protocol: the names, and each operator's class."""

    def __iter__(self):
        return iter(OPERATORS)

    def __getitem__(self, name):
        return OPERATORS[name]
