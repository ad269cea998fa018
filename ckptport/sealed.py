"""Values a pickle can hold but never rewrite.

A frozen dataclass with ``slots=True`` is given a ``__setstate__`` that
assigns every field from a tuple, so a pickle's ``BUILD`` on one of
ckptport's values (a dtype from the shared table, a described tensor, an
allowed wrapper) would rewrite it: a forged itemsize or offset, a swapped
callable. ``sealed`` replaces that method with a refusal. It is applied
after ``@dataclass``, which only adds the method where a class lacks it.
"""

from __future__ import annotations

from typing import NoReturn, TypeVar

__all__ = ["sealed"]

T = TypeVar("T", bound=type)


def sealed(cls: T) -> T:
    def __setstate__(self: object, state: object) -> NoReturn:
        raise TypeError(f"BUILD on a {type(self).__name__}: ckptport's values take no pickle "
                        "state")

    cls.__setstate__ = __setstate__  # type: ignore[attr-defined]
    return cls
