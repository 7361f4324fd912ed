"""The reaper's rules, derived from a lifecycle's compiled table.

Every reaper branch becomes a rule with the store conditions of its guards; a later branch
of the same (state, event) also gets the negation of what distinguishes the earlier ones,
so a set-based move selects exactly the rows the statechart would send down that branch.
"""

from __future__ import annotations

from dataclasses import dataclass

from fsm.engine import Engine
from fsm.records import Actor, Condition
from fsm.table import Branch, branch_conditions, exclusive, negate_condition


@dataclass(frozen=True)
class Rule:
    """One reaper branch, ready to run: where from, what to fire, what the store checks."""

    engine: Engine
    branch: Branch
    require: tuple[Condition, ...]
    set_based: bool

    @property
    def name(self) -> str:
        return f"{self.engine.kind}.{self.branch.event}"


def plan_rules(engine: Engine) -> list[Rule]:
    """The reaper rules of one lifecycle, in the order the statechart would try them.

    A later branch of the same (state, event) only applies to rows the earlier branches
    refused: the rule adds the negation of what distinguishes the earlier branch (e.g.
    Job ``expire`` running->failed gets ``attempt >= max_attempts``).  When that cannot be
    expressed as a store condition, the rule runs row by row through the engine.
    """
    rules: list[Rule] = []
    table = engine.table
    for leaf in table.leaves:
        for event in table.events:
            earlier: list[tuple[Condition, ...]] = []
            for branch in table.branches_for(leaf, event):
                # a branch another descriptor takes for this event ('error' for 'error.timeout')
                # is the reaper's under its own event only: one rule per declared branch
                if branch.actor is not Actor.REAPER or branch.matched is not None:
                    continue
                own = branch_conditions(branch, engine.policy)
                # every guard (cond, or unless on a counter) has a store condition: SQL can run it
                set_based = all(g.condition is not None for g, _ in branch.guards)
                extra: list[Condition] = []
                for previous in earlier:
                    if exclusive(previous, own):
                        continue  # no row meets both (one needs a lease owner, the other none)
                    distinct = [c for c in previous if c not in own]
                    negated = negate_condition(distinct[0]) if len(distinct) == 1 else None
                    if negated is None:
                        set_based = False
                    else:
                        extra.append(negated)
                earlier.append(own)
                rules.append(Rule(engine, branch, own + tuple(extra), set_based))
    return rules


__all__ = ["Rule", "plan_rules"]
