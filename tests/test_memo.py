"""``ByIdentity``: answers kept by an object's identity, never another object's."""

from __future__ import annotations

import gc

from postonce._memo import ByIdentity


def test_an_answer_is_kept_per_object_and_per_extra_part() -> None:
    kept: ByIdentity[str] = ByIdentity(8)
    one, equal = ["a"], ["a"]  # equal, but two objects
    kept.put(one, "one's", "x")
    assert kept.get(one, "x") == "one's"
    assert kept.get(one, "y") is None
    assert kept.get(equal, "x") is None


def test_a_kept_object_lives_so_its_id_is_never_another_objects() -> None:
    """The object is kept with its answer: a new object cannot take its id and its answer."""
    kept: ByIdentity[str] = ByIdentity(8)
    kept.put(["gone"], "the first object's")
    gc.collect()
    strangers = [["new"] for _ in range(1000)]  # would reuse the freed id, were it freed
    assert all(kept.get(stranger) is None for stranger in strangers)


def test_full_it_starts_again_empty() -> None:
    kept: ByIdentity[int] = ByIdentity(2)
    objects = [object() for _ in range(3)]
    for number, about in enumerate(objects):
        kept.put(about, number)
    assert [kept.get(about) for about in objects] == [None, None, 2]
