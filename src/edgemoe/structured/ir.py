"""The compiled schema before it runs: slots of alternatives, then pruned and lowered.

The compiler (schema.py) builds `SlotIR`s: a slot lists leaves and other slots (anyOf,
$ref) whose alternatives it also allows; $ref cycles make this a graph. `lower` then:
1. flattens each slot's alternatives (strongly connected components, so cycles terminate);
2. finds which slots can produce a finite value, and the least nesting it needs (a least
   fixpoint: a tree whose children are required trees cannot), dropping alternatives,
   optional properties and array lengths that cannot, so the matcher never reaches a
   state with no allowed byte;
3. builds the runtime `Slot`s and leaves (nodes.py, scalars.py).
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass, field

from edgemoe.structured.errors import GrammarError
from edgemoe.structured.nodes import ANY, ArrayLeaf, DictLeaf, ObjectLeaf, Slot
from edgemoe.structured.pattern_string import PatternRule, PatternString
from edgemoe.structured.ranged_number import NumRange, RangedNumber
from edgemoe.structured.scalars import FREE, INTEGER, MAX_NESTING, NUMBER, BoundedString, Leaf, Literals


@dataclass(eq=False)
class SlotIR:
    """One place a value goes, as compiled: its own leaves plus other slots it includes."""

    path: str
    leaves: list["LeafIR"] = field(default_factory=list)
    alts: list["SlotIR"] = field(default_factory=list)
    why: tuple[str, str] | None = None  # (path, problem) when no value satisfies it


@dataclass(eq=False)
class LeafIR:
    """One alternative. kind: object, dict, array, string, number, integer, literals, any."""

    kind: str
    path: str
    props: tuple[tuple[str, SlotIR, bool], ...] = ()  # object: (name, value, required)
    value: SlotIR | None = None  # dict
    prefix: tuple[SlotIR, ...] = ()  # array
    items: SlotIR | None = None  # array (None: items false)
    lo: int = 0  # array minItems / string minLength
    hi: int | None = None  # array maxItems / string maxLength
    texts: frozenset[bytes] = frozenset()  # literals
    num: NumRange | None = None  # number / integer: minimum, maximum, exclusive ones
    pattern: PatternRule | None = None  # string: its pattern or format, where enforced

    def needs(self) -> list[SlotIR | None]:
        """Slots that must produce a value for this leaf to (None: a position with no schema)."""
        if self.kind == "object":
            return [s for _, s, req in self.props if req]
        if self.kind == "array":
            need: list[SlotIR | None] = list(self.prefix[: self.lo])
            if self.lo > len(self.prefix):
                need.append(self.items)
            return need
        return []


MAX_FLAT = 100_000  # alternatives summed over all slots once anyOf/$ref are expanded


class Flat:
    """Each slot's alternatives with anyOf/$ref expanded. Slots on one anyOf/$ref cycle
    allow the same values: they share one leaf list and one representative (`rep`)."""

    def __init__(self) -> None:
        self.leaves: dict[SlotIR, list[LeafIR]] = {}
        self.rep: dict[SlotIR, SlotIR] = {}
        self.size = 0

    def reps(self) -> list[SlotIR]:
        """One slot per cycle (component)."""
        return [s for s, r in self.rep.items() if s is r]


def flatten(root: SlotIR) -> Flat:
    """Every slot reachable from root -> all leaves it allows through anyOf/$ref edges.
    Tarjan's SCC algorithm, iterative: $ref chains may be long, cycles are legal."""
    index: dict[SlotIR, int] = {}
    low: dict[SlotIR, int] = {}
    on: set[SlotIR] = set()
    stack: list[SlotIR] = []
    flat = Flat()
    todo: list[SlotIR] = [root]
    while todo:
        start = todo.pop()
        if start in index:
            continue
        work: list[tuple[SlotIR, int]] = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on.add(node)
                for leaf in node.leaves:
                    todo.extend(s for s in (*leaf.prefix, leaf.items, leaf.value) if s is not None)
                    todo.extend(s for _, s, _ in leaf.props)
            if i < len(node.alts):
                work.append((node, i + 1))
                nxt = node.alts[i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on:
                    low[node] = min(low[node], index[nxt])
                continue
            for nxt in node.alts:
                if nxt in on:
                    low[node] = min(low[node], low[nxt])
            if low[node] == index[node]:
                _close_component(node, stack, on, flat)
    return flat


def _close_component(head: SlotIR, stack: list[SlotIR], on: set[SlotIR], flat: Flat) -> None:
    """Pop one SCC: its members share every leaf of the members and of the SCCs below."""
    members: list[SlotIR] = []
    while True:
        s = stack.pop()
        on.discard(s)
        members.append(s)
        if s is head:
            break
    leaves: dict[int, LeafIR] = {}
    for s in members:
        for leaf in s.leaves:
            leaves.setdefault(id(leaf), leaf)
        for nxt in s.alts:
            for leaf in flat.leaves.get(nxt, ()):
                leaves.setdefault(id(leaf), leaf)
    result = list(leaves.values())
    flat.size += len(result)
    if flat.size > MAX_FLAT:
        raise GrammarError(head.path, f"anyOf/$ref alternatives expand to more than {MAX_FLAT} in all")
    for s in members:
        flat.leaves[s] = result
        flat.rep[s] = head


def min_depth(flat: Flat) -> tuple[dict[SlotIR, int], dict[int, int]]:
    """The least nesting a finite value of each slot / leaf (by id) needs; a slot or leaf
    left out produces no finite value at all. Knuth's generalisation of Dijkstra: a leaf's
    need is 1 + the largest need of its required children (0 for scalars), a slot's is its
    smallest leaf's, so values settle in increasing order from a heap."""
    owners: dict[int, list[SlotIR]] = {}
    leaves: dict[int, LeafIR] = {}
    for rep in flat.reps():
        for leaf in flat.leaves[rep]:
            owners.setdefault(id(leaf), []).append(rep)
            leaves[id(leaf)] = leaf
    waiting: dict[int, int] = {}
    users: dict[SlotIR, list[LeafIR]] = {}
    heap: list[tuple[int, int, SlotIR]] = []
    most: dict[int, int] = {}
    leaf_md: dict[int, int] = {}

    def settle(leaf: LeafIR, md: int) -> None:
        leaf_md[id(leaf)] = md
        for rep in owners[id(leaf)]:
            heapq.heappush(heap, (md, id(rep), rep))

    for leaf in leaves.values():
        need = leaf.needs()
        if any(s is None for s in need):
            continue  # needs a position with no schema: never productive
        uniq = {id(r): r for r in (flat.rep[s] for s in need if s is not None)}
        waiting[id(leaf)] = len(uniq)
        for r in uniq.values():
            users.setdefault(r, []).append(leaf)
        if not uniq:
            settle(leaf, 1 if leaf.kind in ("object", "dict", "array") else 0)
    rep_md: dict[SlotIR, int] = {}
    while heap:
        md, _, rep = heapq.heappop(heap)
        if rep in rep_md:
            continue
        rep_md[rep] = md
        for user in users.get(rep, ()):
            most[id(user)] = max(most.get(id(user), 0), md)
            waiting[id(user)] -= 1
            if waiting[id(user)] == 0:
                settle(user, 1 + most[id(user)])
    return {s: rep_md[r] for s, r in flat.rep.items() if r in rep_md}, leaf_md


NO_VALUE = "no finite JSON value (nested at most 128 deep) satisfies this part of the schema"


def culprit(root: SlotIR, flat: Flat, good: dict[SlotIR, int]) -> tuple[str, str]:
    """(path, problem) of a part that makes `root` unsatisfiable, following required
    children (the first alternative's) down to an empty slot, a cycle or a short array."""
    seen: set[SlotIR] = set()
    cur = root
    while cur not in seen:
        seen.add(cur)
        leaves = flat.leaves.get(cur, [])
        if not leaves:
            why = cur.why or next((s.why for s in cur.alts if s.why), None)
            return why or (cur.path, NO_VALUE)
        nxt = None
        for s in leaves[0].needs():
            if s is None:
                return f"{leaves[0].path}.minItems".lstrip("."), NO_VALUE
            if s not in good:
                nxt = s
                break
        if nxt is None:
            return cur.path, NO_VALUE
        cur = nxt
    return cur.path, NO_VALUE


class Lowering:
    """Builds the runtime slots from the flattened, productive IR (memoised per IR node)."""

    def __init__(self, flat: Flat, good: dict[SlotIR, int], good_leaves: dict[int, int]) -> None:
        self.flat, self.good, self.good_leaves = flat, good, good_leaves
        self.slots: dict[SlotIR, Slot] = {}
        self.shared: dict[tuple, Leaf] = {}
        self.todo: list[SlotIR] = []

    def run(self, root: SlotIR) -> Slot:
        """Lower every slot reachable from root (iteratively: recursion may be deep)."""
        out = self.slot(root)
        while self.todo:
            ir = self.todo.pop()
            self.slots[ir].set_leaves(self._leaves_of(ir))
        return out

    def slot(self, ir: SlotIR) -> Slot:
        """The runtime slot for `ir` (one per anyOf/$ref cycle), created empty now and
        filled by `run`."""
        ir = self.flat.rep[ir]
        got = self.slots.get(ir)
        if got is None:
            got = self.slots[ir] = Slot(self.good[ir])
            self.todo.append(ir)
        return got

    def _leaves_of(self, ir: SlotIR) -> list[Leaf]:
        """A slot's productive alternatives; all literal sets merge into one trie."""
        out: dict[int, Leaf] = {}
        texts: set[bytes] = set()
        for leaf in self.flat.leaves[ir]:
            if id(leaf) not in self.good_leaves:
                continue
            if leaf.kind == "literals":
                texts |= leaf.texts
            elif leaf.kind == "any":
                out.update((id(x), x) for x in ANY.leaves)
            else:
                got = self._leaf(leaf)
                out.setdefault(id(got), got)
        if texts:
            lit = self._shared(("literals", frozenset(texts)), lambda: Literals(texts))
            out.setdefault(id(lit), lit)
        return list(out.values())

    def _shared(self, key: tuple, make) -> Leaf:  # type: ignore[no-untyped-def]
        """One leaf per structure, so equal alternatives give equal (deduplicated) threads."""
        got = self.shared.get(key)
        if got is None:
            got = self.shared[key] = make()
        return got

    def _leaf(self, ir: LeafIR) -> Leaf:
        """The runtime leaf for one non-literal alternative."""
        if ir.kind in ("number", "integer"):
            integer, num = ir.kind == "integer", ir.num
            if num is None:
                return INTEGER if integer else NUMBER
            return self._shared(("number", integer, num), lambda: RangedNumber(integer, num))
        if ir.kind == "string":
            if ir.pattern is not None:
                rule = ir.pattern
                return self._shared(("pattern", id(rule.dfa), ir.lo, ir.hi), lambda: PatternString(rule))
            if ir.lo == 0 and ir.hi is None:
                return FREE
            return self._shared(("string", ir.lo, ir.hi), lambda: BoundedString(ir.lo, ir.hi))
        if ir.kind == "dict":
            assert ir.value is not None
            if ir.value not in self.good:
                return self._shared(("object",), lambda: ObjectLeaf((), (), ()))
            value = self.slot(ir.value)
            return self._shared(("dict", id(value)), lambda: DictLeaf(value))
        if ir.kind == "object":
            props = [(k, s, r) for k, s, r in ir.props if s in self.good]
            keys = [json.dumps(k, ensure_ascii=False).encode() for k, _, _ in props]
            slots = [self.slot(s) for _, s, _ in props]
            req = [r for _, _, r in props]
            key = ("object", tuple(keys), tuple(map(id, slots)), tuple(req))
            return self._shared(key, lambda: ObjectLeaf(keys, slots, req))
        return self._array(ir)

    def _array(self, ir: LeafIR) -> Leaf:
        """An array leaf whose upper bound stops at the first position nothing can fill."""
        stop: int | None = None
        for i, s in enumerate(ir.prefix):
            if s not in self.good:
                stop = i
                break
        if stop is None and (ir.items is None or ir.items not in self.good):
            stop = len(ir.prefix)
        hi = stop if ir.hi is None else ir.hi if stop is None else min(ir.hi, stop)
        prefix = [self.slot(s) for s in ir.prefix[: len(ir.prefix) if hi is None else hi]]
        items = None
        if ir.items is not None and (hi is None or hi > len(ir.prefix)):
            items = self.slot(ir.items)
        key = ("array", tuple(map(id, prefix)), id(items), ir.lo, hi)
        return self._shared(key, lambda: ArrayLeaf(prefix, items, ir.lo, hi))


def lower(root: SlotIR) -> tuple[Slot | None, tuple[str, str]]:
    """Runtime root slot, or (None, path of the culprit) when no finite value satisfies it
    (within MAX_NESTING: a deeper required chain counts as unsatisfiable)."""
    flat = flatten(root)
    good, good_leaves = min_depth(flat)
    if good.get(root, MAX_NESTING + 1) > MAX_NESTING:
        return None, culprit(root, flat, good)
    return Lowering(flat, good, good_leaves).run(root), ("", "")
