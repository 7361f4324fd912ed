"""Guard expressions: python-statemachine's ``cond=`` strings, as the table evaluates them.

python-statemachine parses a ``cond``/``unless`` string as a small boolean language: names,
``and``/``or``/``not``, the shorthands ``^`` (and), ``v`` (or), ``!`` (not), ``In('state')``,
constants and comparisons.  An expression is read the way python-statemachine reads it (its
own operator replacement, then Python's parser) and split at its top-level ``and``:

- a conjunct that is a guard name or a negated one (``a``, ``not a``) stays a *literal*:
  the branch carries it as ``(guard, expected)``, and a guard the store re-checks at commit
  (``holds_lease``'s fencing token, ``lease_stale``, counters) keeps its re-check, negated where the store
  can negate it;
- any other conjunct (``a or b``, ``not (a and b)``, ``In('active')``) becomes one
  *expression guard*, named by its text, evaluated on the entity as read.  Its names must
  be guards that depend on the row alone: a guard the store re-checks at commit cannot sit
  under ``or``/``not``, since the store re-checks conjunctions only.

Comparisons, arithmetic and other calls are refused naming the operator; nothing is ever
half-understood.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping

from statemachine.spec_parser import replace_operators

from fsm.errors import InvalidDefinition
from fsm.guards import HOLDS_LEASE, Guard, GuardContext

_ADVICE = "operator not supported, write a named @guard that computes it"

Literal = tuple[str, bool]
"""A guard name and the value a branch expects of it (``not a``: ``("a", False)``)."""


def _operator_of(node: ast.expr) -> str:
    """What ``node`` does, in the words of python-statemachine's expression syntax."""
    if isinstance(node, ast.Compare):
        return "comparison ('==', '!=', '<', '<=', '>', '>=')"
    if isinstance(node, ast.Call):
        return "function call (only In('state') is understood)"
    if isinstance(node, ast.Constant):
        return f"constant {node.value!r}"
    return f"{type(node).__name__} expression"


def _literal(node: ast.expr) -> Literal | None:
    if isinstance(node, ast.Name):
        return (node.id, True)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) and isinstance(node.operand, ast.Name):
        return (node.operand.id, False)
    return None


def read_cond(expr: str, *, unless: bool, where: str) -> list[Literal | ast.expr]:
    """A ``cond`` (or ``unless``) string as the conjuncts a branch requires: literals, and
    the trees of the conjuncts that are expressions (see the module's docstring)."""
    label = f"unless={expr!r}" if unless else f"cond={expr!r}"
    if expr.isidentifier():
        # python-statemachine's own shortcut: a lone identifier is a name, even one that
        # its operator replacement would read as an operator (a guard named ``v``)
        return [(expr, not unless)]
    try:
        tree = ast.parse(replace_operators(expr), mode="eval").body
    except SyntaxError:
        raise InvalidDefinition(f"{where}: guard expression {label} does not parse; {_ADVICE}") from None
    if unless:  # unless=X means not X
        single = _literal(tree)
        if single is not None:
            return [(single[0], not single[1])]
        return [ast.UnaryOp(op=ast.Not(), operand=tree)]
    conjuncts = tree.values if isinstance(tree, ast.BoolOp) and isinstance(tree.op, ast.And) else [tree]
    found: list[Literal | ast.expr] = []
    for node in conjuncts:
        single = _literal(node)
        found.append(single if single is not None else node)
    return found


def _check(
    node: ast.expr, guards: Mapping[str, Guard], states: Mapping[str, frozenset[str]], where: str, text: str
) -> None:
    """Refuse what an expression guard cannot evaluate, naming it (``text``: the whole
    expression, for the message)."""
    if isinstance(node, ast.Name):
        g = guards.get(node.id)
        if g is None:
            raise InvalidDefinition(
                f"{where}: unknown guard {node.id!r} in {text!r} (known guards: {', '.join(sorted(guards))}); "
                "declare it on the class as a function decorated with @guard taking a GuardContext"
            )
        if g.validates:
            raise InvalidDefinition(
                f"{where}: {node.id!r} in {text!r} is a validator (it refuses by raising): name it in validators="
            )
        if g.condition is not None or g is HOLDS_LEASE or g.after is not None:
            # the fencing token and the store's re-checks are conjunctions of the write
            raise InvalidDefinition(
                f"{where}: guard {node.id!r} is re-checked by the store at commit, which re-checks a "
                f"conjunction only; it may not appear under 'or' or 'not' ({text!r}): make it a conjunct "
                f"of its own (cond='{node.id} and (...)')"
            )
        return
    if isinstance(node, ast.BoolOp):
        for value in node.values:
            _check(value, guards, states, where, text)
        return
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        _check(node.operand, guards, states, where, text)
        return
    if isinstance(node, ast.Constant) and isinstance(node.value, bool):
        return
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id.lower() == "in"
        and node.args
        and not node.keywords
        and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args)
    ):
        unknown = [a.value for a in node.args if isinstance(a, ast.Constant) and a.value not in states]
        if unknown:
            named = ", ".join(map(repr, unknown))
            raise InvalidDefinition(f"{where}: {text!r} names no state of the lifecycle: {named}")
        return
    raise InvalidDefinition(
        f"{where}: guard expression {text!r} uses {_operator_of(node)} ({ast.unparse(node)!r}): {_ADVICE}; "
        "the table evaluates guard names combined with and/or/not, and In('state')"
    )


def _evaluator(node: ast.expr, states: Mapping[str, frozenset[str]]) -> Callable[[Callable[[str], bool], str], bool]:
    """``node`` as a function of (each name's answer, the entity's leaf state)."""
    if isinstance(node, ast.Name):
        name = node.id
        return lambda answer, leaf: answer(name)
    if isinstance(node, ast.Constant):
        value = bool(node.value)
        return lambda answer, leaf: value
    if isinstance(node, ast.UnaryOp):
        inner = _evaluator(node.operand, states)
        return lambda answer, leaf: not inner(answer, leaf)
    if isinstance(node, ast.BoolOp):
        parts = [_evaluator(v, states) for v in node.values]
        if isinstance(node.op, ast.And):
            return lambda answer, leaf: all(p(answer, leaf) for p in parts)
        return lambda answer, leaf: any(p(answer, leaf) for p in parts)
    assert isinstance(node, ast.Call)  # In('a', 'b'): every named state is active
    within = [states[str(a.value)] for a in node.args if isinstance(a, ast.Constant)]
    return lambda answer, leaf: all(leaf in leaves for leaves in within)


def expression_guard(
    node: ast.expr, guards: Mapping[str, Guard], states: Mapping[str, frozenset[str]], where: str
) -> Guard:
    """The guard standing for the expression conjunct ``node``; ``states`` maps each state
    id to the leaves inside it (``In('x')`` holds in those)."""
    text = ast.unparse(node)
    _check(node, guards, states, where, text)
    members = tuple(dict.fromkeys(n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in guards))
    evaluate = _evaluator(node, states)

    def check(ctx: GuardContext) -> bool:
        return evaluate(lambda name: bool(guards[name].check(ctx)), ctx.snapshot.state)

    return Guard(name=text, check=check, description=f"the expression {text}", members=members, evaluate=evaluate)


__all__ = ["Literal", "expression_guard", "read_cond"]
