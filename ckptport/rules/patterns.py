"""How long a rename pattern can take, decided from its parsed structure before any key.

Python's ``re`` backtracks: a pattern whose repeats can split one string in
many ways takes exponential time on a key that almost matches (``(a+)+$``,
``(\\w+\\.?)+x``), and a chain of repeats that compete for the same characters
takes polynomial time (``(.*)(.*)x``: n^3 on n characters; ``(.*)x``
unanchored: n^2). A recipe comes with the checkpoint and a key comes from the
file, so both are untrusted, and the bound has to hold before matching starts.

``cost(pattern)`` walks the pattern as ``re`` parsed it, tracking for every
repeat which characters may follow it:

- **refused** (exponential): a repeat inside a repeat whose characters overlap
  what may follow it (the next iteration included): ``(a+)+``, ``(x\\w+)+``;
  alternatives that may begin alike inside a repeat (``(a|ab)+``); a repeat
  whose body may match nothing (``(a*)*``); a backreference (``(\\w+)\\1``).
  ``(\\w+\\.)+`` stays: ``\\w`` never matches the ``.`` that ends it.
- **degree** (polynomial): D = the number of unbounded repeats whose characters
  overlap what follows them, plus one when the pattern is not anchored with
  ``^`` and has such a repeat (``re.sub`` tries every start); at least 1.
  Matching one key of n characters costs at most about n^D steps, so a key is
  renamed only while n^D stays within ``STEPS`` (about a second of ``re``):
  ``^module\\.`` and ``^(.*)\\.weight$`` (D=1) any key; ``(.*)\\.weight``
  (D=2) keys up to 10,000 characters; ``(.*)\\.(.*)\\.weight`` (D=3) up to 464.
  A longer key is refused naming it (a checkpoint's keys have tens of
  characters; ``[^.]*`` instead of ``.*``, or ``^…$``, lowers D).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

if sys.version_info >= (3, 11):
    from re import _constants as _c  # type: ignore[attr-defined]
    from re import _parser as _p  # type: ignore[attr-defined]
else:  # pragma: no cover - Python 3.10
    import sre_constants as _c
    import sre_parse as _p

__all__ = ["Cost", "Exponential", "cost", "STEPS"]

STEPS = 10 ** 8  # the most backtracking steps one key may cost (~1 s of ``re``)
# characters standing for all of Unicode when sets are compared: ASCII, Latin-1, letters of
# other scripts and cases, digits of another script, separators, an astral character
_SAMPLES = frozenset([*map(chr, range(128)), "\x80", "\xa0", "é", "É", "ß", "İ", "ı", "ſ",
                      "K", "\u0660", "\u4e00", "\u2028", "\U0001f600"])
_ALL = _SAMPLES
_NONE: frozenset[str] = frozenset()
_REPEATS = tuple(getattr(_c, name) for name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")
                 if hasattr(_c, name))
_GROUPS = tuple(getattr(_c, name) for name in ("SUBPATTERN", "ATOMIC_GROUP") if hasattr(_c, name))
_STARTS = ((_c.AT, _c.AT_BEGINNING), (_c.AT, _c.AT_BEGINNING_STRING))
# Any: the argument of a node of ``re``'s parser (untyped); its shape is the opcode's: a
# repeat's (low, high, body), a group's nodes, a literal's code point, a set's items
_Arg: TypeAlias = Any
_Node = tuple[object, _Arg]  # (opcode, argument), as ``re``'s parser gives it


@dataclass(frozen=True)
class Cost:
    """What matching one key with the pattern costs: ``n ** degree`` steps on n characters."""

    degree: int

    def longest(self) -> int:
        """The longest key this pattern is applied to."""
        return int(round(STEPS ** (1 / self.degree)))


class Exponential(ValueError):
    """The pattern can backtrack exponentially; the message says where."""


def cost(pattern: str) -> Cost:
    """The pattern's cost; ``Exponential`` if it has none that can be bounded;
    ``re.error`` if it does not parse."""
    parsed = list(_p.parse(pattern))
    walk = _Walk()
    walk.sequence(parsed, _NONE, in_repeat=False)
    anchored = bool(parsed) and parsed[0] in _STARTS
    degree = walk.competing + (0 if anchored or not walk.competing else 1)
    return Cost(max(1, degree))


class _Walk:
    def __init__(self) -> None:
        self.competing = 0  # unbounded repeats that compete with what follows them

    def sequence(self, nodes: list[_Node], follow: frozenset[str], in_repeat: bool) -> None:
        """Check ``nodes`` right to left, ``follow`` being what may come after them."""
        for i in range(len(nodes) - 1, -1, -1):
            rest, rest_nullable = _first(nodes[i + 1:])
            after = rest | follow if rest_nullable else rest
            self.node(nodes[i], after, in_repeat)

    def node(self, node: _Node, follow: frozenset[str], in_repeat: bool) -> None:
        op, av = node
        if op in _REPEATS:
            low, high, body = av
            body = list(body)
            if high <= 1:
                return self.sequence(body, follow, in_repeat)
            first, nullable = _first(body)
            if nullable:
                raise Exponential("a repeat whose body may match nothing")
            if _chars(body) & follow:
                if in_repeat:
                    raise Exponential("a repeat inside a repeat, both able to take the same "
                                      "characters")
                if high == _c.MAXREPEAT:
                    self.competing += 1
            return self.sequence(body, first | follow, in_repeat=True)
        if op in _GROUPS:
            return self.sequence(_body(op, av), follow, in_repeat)
        if op == _c.BRANCH:
            alternatives = [list(a) for a in av[1]]
            if in_repeat:
                seen: set[str] = set()
                for alternative in alternatives:
                    first, nullable = _first(alternative)
                    if nullable or first & seen:
                        raise Exponential("alternatives that may begin alike, inside a repeat")
                    seen |= first
            for alternative in alternatives:
                self.sequence(alternative, follow, in_repeat)
            return None
        if op == _c.GROUPREF_EXISTS:
            for part in av[1:]:
                if part is not None:
                    self.sequence(list(part), follow, in_repeat)
            return None
        if op in (_c.ASSERT, _c.ASSERT_NOT):
            return self.sequence(list(av[1]), _NONE, in_repeat)
        if op == _c.GROUPREF:
            raise Exponential("a backreference (\\1, (?P=name))")
        return None


def _first(nodes: list[_Node]) -> tuple[frozenset[str], bool]:
    """The characters a match of ``nodes`` may begin with, and whether it may be empty."""
    found: frozenset[str] = _NONE
    for op, av in nodes:
        first, nullable = _first_of(op, av)
        found |= first
        if not nullable:
            return found, False
    return found, True


def _first_of(op: object, av: _Arg) -> tuple[frozenset[str], bool]:
    if op in _REPEATS:
        first, nullable = _first(list(av[2]))
        return first, nullable or av[0] == 0
    if op in _GROUPS:
        return _first(_body(op, av))
    if op in (_c.BRANCH, _c.GROUPREF_EXISTS):
        parts = [list(a) for a in (av[1] if op == _c.BRANCH else av[1:]) if a is not None]
        if op == _c.GROUPREF_EXISTS and len(parts) < 2:
            parts.append([])
        firsts = [_first(part) for part in parts]
        return frozenset().union(*(f for f, _ in firsts)), any(n for _, n in firsts)
    if op in (_c.AT, _c.ASSERT, _c.ASSERT_NOT):
        return _NONE, True
    if op == _c.GROUPREF:
        return _ALL, True
    return _atom(op, av), False


def _chars(nodes: list[_Node]) -> frozenset[str]:
    """Every character a match of ``nodes`` may consume."""
    found: frozenset[str] = _NONE
    for op, av in nodes:
        if op in _REPEATS:
            found |= _chars(list(av[2]))
        elif op in _GROUPS:
            found |= _chars(_body(op, av))
        elif op in (_c.BRANCH, _c.GROUPREF_EXISTS):
            for part in (av[1] if op == _c.BRANCH else av[1:]):
                if part is not None:
                    found |= _chars(list(part))
        elif op == _c.GROUPREF:
            found |= _ALL
        elif op not in (_c.AT, _c.ASSERT, _c.ASSERT_NOT):
            found |= _atom(op, av)
    return found


def _body(op: object, av: _Arg) -> list[_Node]:
    """A group's nodes (``(group, add, del, nodes)`` for a capture, ``nodes`` atomic)."""
    return list(av[-1]) if op == _c.SUBPATTERN else list(av)


def _folded(chars: frozenset[str]) -> frozenset[str]:
    """Both cases: overlap is judged as if every pattern were case-insensitive (the safe
    side: it can only find more overlap)."""
    return frozenset(c for c in _SAMPLES if c in chars or c.lower() in chars
                     or c.upper() in chars or c.swapcase() in chars)


_CATEGORIES: dict[str, Callable[[str], bool]] = {
    "CATEGORY_DIGIT": str.isdecimal, "CATEGORY_SPACE": str.isspace,
    "CATEGORY_WORD": lambda c: c.isalnum() or c == "_",
    "CATEGORY_LINEBREAK": lambda c: c == "\n",
}


def _category(name: str) -> frozenset[str]:
    negate = name.startswith("CATEGORY_NOT_")
    test = _CATEGORIES.get(name.replace("NOT_", "").replace("LOC_", "").replace("UNI_", ""))
    if test is None:
        return _ALL
    chosen = frozenset(c for c in _SAMPLES if test(c))
    return _SAMPLES - chosen if negate else chosen


def _atom(op: object, av: _Arg) -> frozenset[str]:
    """The characters one single-character node matches (over ``_SAMPLES``, both cases)."""
    if op == _c.LITERAL:
        return _folded(frozenset([chr(av)]))
    if op == _c.NOT_LITERAL:
        return _SAMPLES - _folded(frozenset([chr(av)]))
    if op == _c.IN:
        chosen: frozenset[str] = _NONE
        negate = False
        for kind, value in av:
            if kind == _c.NEGATE:
                negate = True
            elif kind == _c.LITERAL:
                chosen |= {chr(value)}
            elif kind == _c.RANGE:
                low, high = value
                chosen |= {c for c in _SAMPLES if low <= ord(c) <= high}
            elif kind == _c.CATEGORY:
                chosen |= _category(str(value))
            else:
                chosen |= _ALL
        chosen = _folded(chosen)
        return _SAMPLES - chosen if negate else chosen
    return _ALL  # ANY and anything else: every character
