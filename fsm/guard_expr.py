"""Guard expressions: which of python-statemachine's ``cond=`` strings the table evaluates.

python-statemachine parses a ``cond``/``unless`` string as a small boolean language: names,
``and``/``or``/``not``, the shorthands ``^`` (and), ``v`` (or), ``!`` (not), comparisons and
``In('state')``.  The compiled table evaluates a conjunction of named guards and nothing
else, because every guard must be persisted, re-checked by the store and drawn by name.
So an expression is read the way python-statemachine reads it (its own operator
replacement, then Python's parser) and either reduced to the guard names it conjoins, or
refused naming the operator; it is never half-understood.
"""

from __future__ import annotations

import ast

from statemachine.spec_parser import replace_operators

from fsm.errors import InvalidDefinition

_ADVICE = "operator not supported, write a named @guard that computes it"


def _operator_of(node: ast.expr) -> str:
    """What ``node`` does, in the words of python-statemachine's expression syntax."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return "negation ('!' / 'not')"
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
        return "disjunction ('v' / 'or')"
    if isinstance(node, ast.BoolOp):
        inner = next(v for v in node.values if not isinstance(v, ast.Name))
        return _operator_of(inner)
    if isinstance(node, ast.Compare):
        return "comparison ('==', '!=', '<', '<=', '>', '>=')"
    if isinstance(node, ast.Call):
        return "function call (such as In(...))"
    if isinstance(node, ast.Constant):
        return f"constant {node.value!r}"
    return f"{type(node).__name__} expression"


def guard_names(expr: str, *, unless: bool, where: str) -> list[str]:
    """The guard names a ``cond`` (or ``unless``) string conjoins.

    Accepted: one name (``"tests_green"``), or for ``cond`` a conjunction of names
    (``"a and b"``, python-statemachine's ``"a ^ b"``).  An ``unless`` names one guard:
    ``unless="a and b"`` means *not (a and b)*, a disjunction the table cannot express.
    """
    label = f"unless={expr!r}" if unless else f"cond={expr!r}"
    if expr.isidentifier():
        # python-statemachine's own shortcut: a lone identifier is a name, even one that
        # its operator replacement would read as an operator (a guard named ``v``)
        return [expr]
    try:
        tree = ast.parse(replace_operators(expr), mode="eval").body
    except SyntaxError:
        raise InvalidDefinition(f"{where}: guard expression {label} does not parse; {_ADVICE}") from None
    if isinstance(tree, ast.Name):
        return [tree.id]
    conjunction = (
        isinstance(tree, ast.BoolOp)
        and isinstance(tree.op, ast.And)
        and all(isinstance(v, ast.Name) for v in tree.values)
    )
    if conjunction and unless:
        raise InvalidDefinition(
            f"{where}: unless={expr!r} combines guards; write one guard per unless= entry "
            "(unless=['a', 'b'] means neither a nor b)"
        )
    if conjunction:
        assert isinstance(tree, ast.BoolOp)
        return [v.id for v in tree.values if isinstance(v, ast.Name)]
    negation = "negation" in _operator_of(tree) and not unless
    hint = " (or unless='name' to negate one guard)" if negation else ""
    raise InvalidDefinition(
        f"{where}: guard expression {label} uses {_operator_of(tree)}: {_ADVICE}{hint}; the table "
        "evaluates a guard name, a list of names (cond=['a', 'b']) or their conjunction ('a and b')"
    )


__all__ = ["guard_names"]
