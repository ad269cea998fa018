"""``ckptport.unpickle.settle``: the limits every tree meets after the pickle ran.

The trees are built here as the engine hands them over (plain containers,
``ObjectRecord``s), so each limit is tested on its own: nesting, cycles,
integers too large to print, set items, attributes of a state dict.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import pytest

from ckptport.tree import Backref, ObjectRecord
from ckptport.unpickle.settle import MAX_DEPTH, MAX_INT_BITS, settle
from ckptport.unpickle.values import Refusal


def settled(value: Any) -> Any:
    return settle(value, []).value


def refusal(value: Any) -> str:
    with pytest.raises(Refusal) as caught:
        settle(value, [])
    return str(caught.value)


def nested(levels: int, wrap: Callable[[Any], Any]) -> Any:
    value: Any = wrap(None)
    for _ in range(levels - 1):
        value = wrap(value)
    return value


# how many levels one wrap adds (a record holds its state dict, which holds the child)
LEVELS = {"list": 1, "dict": 1, "tuple": 1, "record": 2, "mixed": 3}
WRAPPERS = {
    "list": lambda x: [x],
    "dict": lambda x: {"k": x},
    "tuple": lambda x: (x,),
    "record": lambda x: ObjectRecord("pkg.Node", state={"child": x}),
    "mixed": lambda x: [{"k": (x, 1)}],
}


# -- nesting ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", WRAPPERS)
def test_nesting_to_max_depth_is_kept(kind):
    tree = nested(MAX_DEPTH // LEVELS[kind], WRAPPERS[kind])
    assert settled(tree) is tree  # nothing to convert: the same containers, checked


@pytest.mark.parametrize("kind", WRAPPERS)
def test_nesting_past_max_depth_is_refused(kind):
    tree = nested(MAX_DEPTH // LEVELS[kind] + 5, WRAPPERS[kind])
    assert refusal(tree) == f"the pickle nests deeper than {MAX_DEPTH} levels"


@pytest.mark.parametrize("container", ["dict key", "set item"])
def test_a_key_or_set_item_nesting_past_max_depth_is_refused(container):
    deep = nested(MAX_DEPTH + 2, lambda x: (x,))
    tree = {deep: 1} if container == "dict key" else {"s": {deep}}
    assert f"a dict key or set item nests deeper than {MAX_DEPTH} levels" in refusal(tree)


# -- cycles ---------------------------------------------------------------------------


def test_a_list_holding_itself_becomes_a_backref_to_the_root():
    loop: list[Any] = [1]
    loop.append(loop)
    assert settled(loop) == [1, Backref("<root>")]


def test_a_cycle_is_cut_where_it_closes_and_names_its_target():
    tree: dict[str, Any] = {"model": {"layers": [{"name": "fc"}]}}
    tree["model"]["layers"][0]["parent"] = tree["model"]
    out = settled(tree)
    assert out["model"]["layers"][0] == {"name": "fc", "parent": Backref("model")}


def test_a_record_pointing_back_at_its_parent_becomes_a_backref():
    parent = ObjectRecord("pkg.Parent", state={})
    child = ObjectRecord("pkg.Child", state={"_parent": parent})
    parent.state["children"] = [child]
    out = settled({"net": parent})
    assert out["net"].state["children"][0].state["_parent"] == Backref("net")


def test_a_cycle_closing_through_a_tuple_is_refused():
    holder: list[Any] = []
    holder.append((holder,))  # the tuple, which cannot hold a Backref, closes the cycle
    assert refusal({"x": 1, "loop": holder}) == \
        "a reference cycle through an immutable container at loop.0.0"


def test_a_tuple_reached_again_through_a_list_is_cut_at_the_list():
    inner: list[Any] = []
    outer = (inner,)
    inner.append(outer)
    assert settled(outer) == ([Backref("<root>")],)


def test_shared_but_acyclic_references_are_kept_as_shared():
    shared = {"w": 1.0}
    out = settled({"a": [shared], "b": [shared]})
    assert out["a"][0] is out["b"][0]


# -- integers -------------------------------------------------------------------------


LARGEST = (1 << MAX_INT_BITS) - 1


@pytest.mark.parametrize("value", [LARGEST, -LARGEST, 0, -1])
def test_integers_up_to_the_limit_are_kept(value):
    assert settled({"n": value, "seq": [value, (value, "x")]}) == {
        "n": value, "seq": [value, (value, "x")]}


@pytest.mark.parametrize("where, tree", [
    ("n", lambda big: {"n": big}),
    ("seq.1", lambda big: {"seq": [0, big]}),
    ("seq.0.1", lambda big: {"seq": [(0, big)]}),
    ("state", lambda big: {"r": ObjectRecord("pkg.Step", state=big)}),
])
@pytest.mark.parametrize("sign", [1, -1])
def test_an_integer_too_large_to_print_is_refused_naming_its_key(where, tree, sign):
    big = sign * (1 << MAX_INT_BITS)
    message = refusal(tree(big))
    assert message.startswith(f"an integer of {MAX_INT_BITS + 1} bits at ")
    assert where in message and "too large to print or convert" in message


# -- set items and keys ------------------------------------------------------------------


def test_sets_of_plain_values_are_kept():
    items = {1, "a", 2.5, None, b"x", (1, ("nested", 2))}
    out = settled({"s": set(items), "f": frozenset(items)})
    assert out == {"s": items, "f": frozenset(items)}


@pytest.mark.parametrize("item", [frozenset({1}), ObjectRecord("pkg.Key"),
                                  (1, frozenset({2})), 1 << MAX_INT_BITS])
def test_a_set_holding_anything_but_plain_values_is_refused(item):
    if isinstance(item, ObjectRecord):
        item = _hashable(item)
    assert "a set at s holds something other than plain values" in refusal({"s": {item}})


def _hashable(record: ObjectRecord) -> Any:
    """A record that can sit in a set (records are unhashable by design)."""
    return type("HashableRecord", (ObjectRecord,), {"__hash__": object.__hash__})(record.name)


@pytest.mark.parametrize("key", [frozenset({1}), 1 << MAX_INT_BITS])
def test_a_dict_key_that_is_not_plain_is_refused(key):
    message = refusal({"d": {key: 1}})
    assert "a dict key at d is a " in message
    assert "ckptport keeps keys that are plain values" in message


def test_plain_keys_of_every_kind_are_kept():
    tree = {1: "a", (1, "b"): 2, None: 3, 2.5: 4, b"k": 5}
    assert settled({"d": tree}) == {"d": tree}


# -- attributes of OrderedDicts ------------------------------------------------------------


def test_a_state_dicts_metadata_is_kept():
    state = collections.OrderedDict(w=1.0)
    state._metadata = collections.OrderedDict({"": {"version": 1}})  # type: ignore[attr-defined]
    out = settled({"state_dict": state})["state_dict"]
    assert out == {"w": 1.0} and out._metadata == {"": {"version": 1}}


def test_metadata_is_settled_like_any_value():
    state = collections.OrderedDict(w=1.0)
    state._metadata = {"": {"n": 1 << MAX_INT_BITS}}  # type: ignore[attr-defined]
    assert "too large to print or convert" in refusal(state)


@pytest.mark.parametrize("kind, attribute", [
    (collections.OrderedDict, "extra"),
    (collections.OrderedDict, "__dict__"),
    (collections.Counter, "_metadata"),
])
def test_any_other_attribute_is_refused(kind, attribute):
    mapping = kind(w=1)
    vars(mapping)[attribute] = 1
    message = refusal({"sd": mapping})
    assert f"a {kind.__name__} at sd carries the attribute {attribute!r}" in message
    assert "only a state dict's _metadata is kept" in message
