"""A number or integer held to `minimum` / `maximum` / `exclusiveMinimum` / `exclusiveMaximum`
and `multipleOf`.

Written without an exponent (`-?(0|[1-9][0-9]*)(\\.[0-9]+)?`, the digit runs capped as
`Number`'s), so every prefix's future values are a few intervals: a prefix is allowed only
where one of them meets the range, and the number may end only where its value is in it.
The frame keeps the text read so far until every continuation is in the range, then only
its syntax (`RangedNumber`). A minus sign always leads to a value below zero ("-0" is not
written).
Exact arithmetic (`Fraction`) throughout: a bound such as 0.1 is the decimal the schema's
JSON wrote, and so is the value compared with it (0.3 is a multiple of 0.1 here, as it is
in decimal; a validator dividing doubles may say otherwise).

`multipleOf` m: the values that can be written are the multiples of the unit (1 for an
integer, 10^-20 for a number), so those valid are the multiples of lcm(unit, m) — a
prefix is allowed where an interval of its futures holds one inside the range; the text
is kept to the end (never loose: whether it ends on a multiple depends on every digit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Iterable

from edgemoe.structured.errors import GrammarError, Unsatisfiable
from edgemoe.structured.scalars import (
    DOT,
    IS_DIGIT,
    MAX_FRAC_DIGITS,
    MAX_INT_DIGITS,
    MINUS,
    Frame,
    Leaf,
    Parents,
    Thread,
    hand_on,
)

EPS = Fraction(1, 10**MAX_FRAC_DIGITS)  # the finest step a fraction can take
_DIGITS = tuple(range(0x30, 0x3A))


@dataclass(frozen=True)
class NumRange:
    """lo / hi: None for unbounded; `*_open`: exclusive; `step`: multipleOf (None: any)."""

    lo: Fraction | None = None
    lo_open: bool = False
    hi: Fraction | None = None
    hi_open: bool = False
    step: Fraction | None = None

    def contains(self, x: Fraction) -> bool:
        above = self.lo is None or x > self.lo or (x == self.lo and not self.lo_open)
        below = self.hi is None or x < self.hi or (x == self.hi and not self.hi_open)
        return above and below and (self.step is None or (x / self.step).denominator == 1)

    def meets(self, a: Fraction, b: Fraction, integer: bool) -> bool:
        """Whether [a, b] holds a value in the range that can be written: an integer, or a
        decimal of at most MAX_FRAC_DIGITS fraction digits (a multiple of EPS); with a
        step, a multiple of it too (of both: of their least common multiple)."""
        low, low_open = a, False
        if self.lo is not None and (self.lo > a or (self.lo == a and self.lo_open)):
            low, low_open = self.lo, self.lo_open
        high, high_open = b, False
        if self.hi is not None and (self.hi < b or (self.hi == b and self.hi_open)):
            high, high_open = self.hi, self.hi_open
        unit = Fraction(1) if integer else EPS
        if self.step is not None:
            unit = fraction_lcm(unit, self.step)
        low, high = low / unit, high / unit  # in units: the values are the integers
        first = math.floor(low) + 1 if low_open and low.denominator == 1 else math.ceil(low)
        last = math.ceil(high) - 1 if high_open and high.denominator == 1 else math.floor(high)
        return first <= last


def read_range(schema: dict[str, Any], path: str) -> NumRange | None:
    """A schema's bounds: `minimum` / `maximum`, `exclusiveMinimum` / `exclusiveMaximum` as
    numbers (draft 6 on) or as draft 4's flags on the other two; None when unbounded."""
    lo, hi = _bound(schema, "minimum", path), _bound(schema, "maximum", path)
    lo_open = hi_open = False
    xlo, xhi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if isinstance(xlo, bool):
        lo_open = xlo and lo is not None
    elif (v := _bound(schema, "exclusiveMinimum", path)) is not None and (lo is None or v >= lo):
        lo, lo_open = v, True
    if isinstance(xhi, bool):
        hi_open = xhi and hi is not None
    elif (v := _bound(schema, "exclusiveMaximum", path)) is not None and (hi is None or v <= hi):
        hi, hi_open = v, True
    step = _bound(schema, "multipleOf", path)
    if step is not None and step <= 0:
        raise GrammarError(f"{path}.multipleOf" if path else "multipleOf", f"multipleOf must be above 0, not {step}")
    return None if lo is None and hi is None and step is None else NumRange(lo, lo_open, hi, hi_open, step)


def _inside_doubles(rng: NumRange) -> NumRange:
    lo, lo_open, hi, hi_open = rng.lo, rng.lo_open, rng.hi, rng.hi_open
    if lo is not None and lo_open:
        lo, lo_open = _moved_in(lo, math.inf)
    if hi is not None and hi_open:
        hi, hi_open = _moved_in(hi, -math.inf)
    return NumRange(lo, lo_open, hi, hi_open, rng.step)


def _moved_in(bound: Fraction, inward: float) -> tuple[Fraction, bool]:
    """An exclusive bound as (bound, exclusive) over decimals whose doubles it excludes: the
    halfway point to the next double inward, itself excluded where it rounds onto the
    bound's double (ties go to even). Never looser than the bound as written; unmoved
    beyond the numbers the grammar writes (20 integer digits) or the doubles' range."""
    if abs(bound) >= 10**MAX_INT_DIGITS:
        return bound, True
    double = float(bound)
    neighbour = math.nextafter(double, inward)
    if math.isinf(neighbour):
        return bound, True
    halfway = (Fraction(double) + Fraction(neighbour)) / 2
    if (halfway - bound) * (1 if inward > 0 else -1) < 0:  # the bound as written is tighter
        return bound, True
    return halfway, float(halfway) == double


def fraction_lcm(a: Fraction, b: Fraction) -> Fraction:
    """The least positive rational that is a multiple of both (positive) a and b."""
    return Fraction(math.lcm(a.numerator, b.numerator), math.gcd(a.denominator, b.denominator))


def number_range(schema: dict[str, Any], path: str, integer: bool) -> NumRange | None:
    """`read_range`, refusing a range no number of the kind can be in (Unsatisfiable: an
    anyOf alternative or optional property is pruned, a root left with nothing refused).
    A number's exclusive bounds move in to the halfway points to the adjacent doubles (still
    exclusive): a client reads the number as a double, and a decimal just inside an
    exclusive bound may round to the bound itself (0.99999999999999999999 reads as 1.0,
    which `exclusiveMaximum: 1` refuses); one short of the halfway point rounds away."""
    rng = read_range(schema, path)
    if rng is not None and not integer:
        rng = _inside_doubles(rng)
    if rng is not None and not RangedNumber(integer, rng).first_bytes():
        kind = "integer" if integer else "number"
        step = " and a multiple of multipleOf" if rng.step is not None else ""
        raise Unsatisfiable(path, f"no {kind} is within the bounds{step} (at most 20 digits either side of "
                                  f"the point)")
    return rng


def as_fraction(value: int | float) -> Fraction:
    """A JSON number exactly as written (a float by its shortest repr: 0.1 is 1/10)."""
    return Fraction(repr(value)) if isinstance(value, float) else Fraction(value)


def _bound(schema: dict[str, Any], key: str, path: str) -> Fraction | None:
    value = schema.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float)
                                                                          and not math.isfinite(value)):
        raise GrammarError(f"{path}.{key}" if path else key, f"{key} must be a number, not {value!r}")
    return as_fraction(value)


def _value(text: bytes) -> Fraction:
    return Fraction(text.decode())


def _reach(text: bytes, integer: bool) -> list[tuple[Fraction, Fraction]]:
    """Closed intervals holding every value the prefix `text` can still end as."""
    neg = text.startswith(b"-")
    body = text[1:] if neg else text
    int_part, dot, frac = body.partition(b".")
    step = 1 if integer else EPS
    if dot:
        base = _value(int_part + b"." + frac) if frac else Fraction(int(int_part))
        out = [(base, base + Fraction(1, 10 ** len(frac)) - EPS)]
    elif not int_part:
        out = [(Fraction(0), Fraction(10**MAX_INT_DIGITS) - step)]
    elif int_part == b"0":
        out = [(Fraction(0), Fraction(0) if integer else 1 - EPS)]
    else:
        d = int(int_part)
        out = [(Fraction(d * 10**m), Fraction((d + 1) * 10**m) - step)
               for m in range(MAX_INT_DIGITS - len(int_part) + 1)]
    if neg:  # below zero only
        out = [(-b, min(-a, -step)) for a, b in out if -b <= -step]
    return out


class RangedNumber(Leaf):
    """A number (or integer) in `range`. Frames `(self, text)` while the bounds matter, then,
    once every way the text can go on ends in the range, `(self, LOOSE, shape)`: only the
    syntax is left, so such states are shared (the masks' cache hits, as for `Number`)."""

    __slots__ = ("integer", "range")

    def __init__(self, integer: bool, range: NumRange) -> None:  # noqa: A002
        self.integer = integer
        self.range = range

    def viable(self, text: bytes) -> bool:
        return any(self.range.meets(a, b, self.integer) for a, b in _reach(text, self.integer))

    def complete(self, text: bytes) -> bool:
        if not text or text[-1:] in (b"-", b"."):
            return False
        value = _value(text)
        return (value < 0 or not text.startswith(b"-")) and self.range.contains(value)

    def first_bytes(self) -> Iterable[int]:
        return [b for b in (MINUS, *_DIGITS) if self.viable(bytes([b]))]

    def begin(self, byte: int, parents: Parents, depth: int) -> Iterable[Thread]:
        text = bytes([byte])
        return ((self._frame(text), parents),) if self.viable(text) else ()

    def _frame(self, text: bytes) -> Frame:
        """The canonical frame: loose once the range holds every completion (the intervals'
        ends are writable values, and the range is convex); with a step, never."""
        futures = _reach(text, self.integer)
        if self.range.step is None and all(self.range.contains(a) and self.range.contains(b) for a, b in futures):
            return (self, LOOSE, _shape(text))
        return (self, text)

    def step(self, thread: Thread, byte: int) -> Iterable[Thread]:
        frame, parents = thread
        if frame[1] is LOOSE:
            grown = _grow(frame[2], byte, self.integer)
            if grown is not None:
                return (((self, LOOSE, grown), parents),)
            return hand_on(parents, byte) if _ends(frame[2]) else ()
        text = frame[1]
        if _grow(_shape(text), byte, self.integer) is not None:
            longer = text + bytes([byte])
            return ((self._frame(longer), parents),) if self.viable(longer) else ()
        return hand_on(parents, byte) if self.complete(text) else ()

    def can_end(self, frame: Frame) -> bool:
        return _ends(frame[2]) if frame[1] is LOOSE else self.complete(frame[1])

    def more(self, frame: Frame) -> bool:
        if frame[1] is LOOSE:
            return any(_grow(frame[2], b, self.integer) is not None for b in (DOT, *_DIGITS))
        text = frame[1]
        return any(_grow(_shape(text), b, self.integer) is not None and self.viable(text + bytes([b]))
                   for b in (DOT, *_DIGITS))


LOOSE = "loose"
# A number's syntax position: (minus, integer digits, integer part "0", dot, fraction
# digits, a digit other than 0 seen). "-" then only zeros never ends (no "-0").
Shape = tuple[bool, int, bool, bool, int, bool]


def _shape(text: bytes) -> Shape:
    int_part, dot, frac = text.lstrip(b"-").partition(b".")
    nonzero = any(c not in b"0" for c in int_part + frac)
    return (text.startswith(b"-"), len(int_part), int_part == b"0", bool(dot), len(frac), nonzero)


def _grow(shape: Shape, byte: int, integer: bool) -> Shape | None:
    """The shape after `byte` where the syntax takes it (digit runs capped as `Number`'s)."""
    neg, n_int, zero, dot, n_frac, nonzero = shape
    digit = IS_DIGIT[byte]
    if dot:
        ok = digit and n_frac < MAX_FRAC_DIGITS
        return (neg, n_int, zero, dot, n_frac + 1, nonzero or byte != 0x30) if ok else None
    if byte == DOT:
        return (neg, n_int, zero, True, 0, nonzero) if not integer and n_int else None
    if digit and not zero and n_int < MAX_INT_DIGITS:
        return (neg, n_int + 1, n_int == 0 and byte == 0x30, dot, 0, nonzero or byte != 0x30)
    return None


def _ends(shape: Shape) -> bool:
    neg, n_int, _, dot, n_frac, nonzero = shape
    return n_int > 0 and not (dot and n_frac == 0) and (nonzero or not neg)
