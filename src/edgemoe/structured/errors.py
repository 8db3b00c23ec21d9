"""GrammarError: a JSON Schema the structured-output grammar cannot honour."""

from __future__ import annotations


class GrammarError(ValueError):
    """A schema we cannot honour. `path` names where, dotted from the schema root, e.g.
    "properties.items.items.type" ("" for the root); str(err) is a sentence naming it."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"schema at {path or 'the root'}: {problem}")


class Unsatisfiable(GrammarError):
    """No value can satisfy this part (types, enum or const of merged parts that do not
    meet; false in allOf). Inside an anyOf alternative or an optional part it is pruned,
    not raised; it is raised (by the compiler) only when that leaves the root nothing."""
