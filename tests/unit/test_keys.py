"""The key order and the range algebra, against brute force over a small universe."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rubberband import keys as K

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=K.MIN_INT, max_value=K.MAX_INT),
    st.floats(allow_nan=False),
    st.text(max_size=6),
    st.binary(max_size=6),
)
key_values = st.recursive(
    scalars, lambda inner: st.tuples(inner, inner) | st.tuples(inner), max_leaves=4
)


def test_ranks_order_types_and_never_raise():
    ordered = [
        K.MIN,
        None,
        False,
        True,
        -5,
        0.5,
        1,
        "a",
        "b",
        b"\x00",
        (),
        (None,),
        (1, "x"),
        K.MAX,
    ]
    enc = [K.encode_key(k) for k in ordered]
    assert enc == sorted(enc)
    assert len(set(enc)) == len(enc)


def test_ints_and_floats_are_one_rank_but_bools_are_not():
    assert K.encode_key(1) == K.encode_key(1.0)
    assert K.encode_key(True) != K.encode_key(1)
    assert K.encode_key(0.5) < K.encode_key(1) < K.encode_key(1.5)


@pytest.mark.parametrize(
    ("bad", "why"),
    [(float("nan"), "NaN"), ({1}, "not a key type"), (2**70, "64-bit"), ([1], "not a key type")],
)
def test_non_keys_are_refused_with_a_reason(bad, why):
    with pytest.raises(K.BadKey, match=why):
        K.encode_key(bad)


def test_deep_tuples_are_refused():
    k: object = 1
    for _ in range(K.MAX_TUPLE_DEPTH + 1):
        k = (k,)
    with pytest.raises(K.BadKey, match="nest"):
        K.encode_key(k)


@given(key_values, key_values)
def test_order_is_total_and_matches_python_where_python_orders(a, b):
    ea, eb = K.encode_key(a), K.encode_key(b)
    assert (ea < eb) + (ea == eb) + (ea > eb) == 1
    if type(a) is type(b) and type(a) in (int, str, bytes):
        assert (ea < eb) == (a < b)


@given(key_values)
def test_encoding_round_trips_through_msgpack(k):
    e = K.encode_key(k)
    wire = msgpack.unpackb(msgpack.packb(e, use_bin_type=True), use_list=False, raw=False)
    assert wire == e
    assert K.is_ekey(wire)
    back = K.decode_key(wire)
    assert K.encode_key(back) == e


@given(key_values)
def test_a_point_range_holds_its_key_alone(k):
    lo, hi = K.point(k)
    assert lo < hi and K.is_bound(hi)
    assert K.contains(((lo, hi),), lo)


@given(key_values, key_values)
def test_nothing_lies_between_a_key_and_its_after(a, b):
    ea, eb = K.encode_key(a), K.encode_key(b)
    assert not (ea < eb < K.after(ea))


key_or_infinity = st.one_of(key_values, st.sampled_from([K.MIN, K.MAX]))


@given(key_or_infinity, key_or_infinity)
def test_flat_sort_forms_order_and_equal_as_encoded_keys_do(a, b):
    ea, eb = K.encode_key(a), K.encode_key(b)
    fa, fb = K.sort_key(a), K.sort_key(b)
    assert (fa < fb, fa == fb, fa > fb) == (ea < eb, ea == eb, ea > eb)
    assert (hash(fa) == hash(fb)) if fa == fb else True
    assert K.sort_bound(ea) == fa
    # A range's end: after(a) lies just above a in both forms.
    ta = K.sort_bound(K.after(ea))
    assert (ta < fb, ta == fb, ta > fb) == (K.after(ea) < eb, K.after(ea) == eb, K.after(ea) > eb)


def test_flat_sort_forms_spell_tuples_out_and_refuse_what_encoding_refuses():
    assert K.sort_key(("~view", "v", (3, 4))) == (
        5,
        3,
        "~view",
        3,
        "v",
        5,
        2,
        3,
        2,
        4,
        K.END,
        K.END,
    )
    assert K.sort_key(7) == K.encode_key(7) and K.sort_key(()) == (5, K.END)
    assert K.sort_key((1,)) < K.sort_key((1, None)) < K.sort_key((1.5,))
    for bad in (float("nan"), (1, {1}), (2**70,), ("a", [1])):
        with pytest.raises(K.BadKey):
            K.sort_key(bad)
    deep: object = 1
    for _ in range(K.MAX_TUPLE_DEPTH + 1):
        deep = (deep,)
    with pytest.raises(K.BadKey, match="nest"):
        K.sort_key(deep)


def test_stable_hash_is_stable():
    assert K.stable_hash32("abc") == K.stable_hash32("abc")
    assert 0 <= K.stable_hash32((1, "x")) < 2**32
    assert K.stable_hash32(1) == K.stable_hash32(1.0)


# ------------------------------------------------------------------ range algebra
UNIVERSE = list(range(0, 12))
bounds = st.integers(min_value=0, max_value=12)


def _rs(pairs):
    return K.normalize(((2, a), (2, b)) for a, b in pairs)


range_sets = st.lists(st.tuples(bounds, bounds), max_size=5).map(_rs)


def _members(rs):
    return {x for x in UNIVERSE if K.contains(rs, (2, x))}


@given(range_sets, range_sets)
@settings(max_examples=300)
def test_algebra_matches_sets(a, b):
    assert _members(K.union(a, b)) == _members(a) | _members(b)
    assert _members(K.intersect(a, b)) == _members(a) & _members(b)
    assert _members(K.difference(a, b)) == _members(a) - _members(b)
    assert K.covers(a, b) == (_members(b) <= _members(a))
    assert K.overlaps(a, b) == bool(_members(a) & _members(b))
    for rs in (K.union(a, b), K.intersect(a, b), K.difference(a, b)):
        assert K.is_range_set(rs)
        assert K.normalize(rs) == rs


@given(range_sets)
def test_normalized_sets_are_canonical(a):
    assert _rs([(lo[1], hi[1]) for lo, hi in a]) == a
    assert K.difference(K.EVERYTHING, K.difference(K.EVERYTHING, a)) == a


def test_touching_ranges_merge_and_malformed_sets_are_refused():
    assert _rs([(1, 3), (3, 5)]) == (((2, 1), (2, 5)),)
    assert not K.is_range_set((((2, 3), (2, 1)),))
    assert not K.is_range_set((((2, 1), (2, 3)), ((2, 2), (2, 5))))
    assert not K.is_range_set(([(2, 1), (2, 3)],))
    assert K.is_range_set(K.EVERYTHING)


def test_describe_is_readable():
    text = K.describe(K.union((K.key_range(20, 40),), (K.point("z"),)))
    assert text == "[20, 40) | ['z', 'z'+)"


def test_describe_marks_the_bound_after_min_and_none_alike():
    assert K.describe((K.point(K.MIN),)) == "[MIN, MIN+)"
    assert K.describe((K.point(None),)) == "[None, None+)"


@given(key_values, key_values)
def test_equal_keys_hash_alike(a, b):
    if K.encode_key(a) == K.encode_key(b):
        assert K.stable_hash32(a) == K.stable_hash32(b)


_scalars = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.booleans(),
    st.text(max_size=3),
    st.binary(max_size=3),
    st.none(),
)
_tuples = st.tuples(st.sampled_from([-1, 0, 1, 2, 3, 4, 9, True, 2.0]), _scalars)


def _lookalike(lo: tuple, pick: int, z: object) -> tuple:
    """``lo`` and a bound one past it whose parts are equal to ``lo``'s but perhaps of
    another type (``1 == True == 1.0``): only the exact one is ``after(lo)``."""
    rank, v = lo
    if type(rank) in (int, bool):
        ranks = [rank, float(rank), bool(rank)]
    else:  # a float rank under an int one: the bound is exact, the key is not
        ranks = [rank, int(rank)] if type(rank) is float else [rank]
    vs = [v]
    if type(v) in (int, bool) and abs(v) < 2**53:
        vs += [float(v), bool(v)]
    return (lo, (ranks[pick % len(ranks)], vs[(pick // 3) % len(vs)], z))


_keys = st.one_of(st.integers(-5, 5), st.booleans(), st.text(max_size=2))
_lookalikes = st.builds(
    _lookalike,
    st.one_of(st.builds(K.encode_key, _keys), _tuples),
    st.integers(0, 8),
    st.sampled_from([0, 0.0, False]),
)
_ranges = st.one_of(
    st.builds(K.point, st.one_of(st.integers(-(2**60), 2**60), st.text(max_size=3))),
    _lookalikes,
    st.tuples(_tuples, st.builds(lambda t, z: (*t, z), _tuples, st.sampled_from([0, 0.0, False]))),
    st.tuples(_tuples, _tuples),
)


def _general(value: tuple) -> bool:
    """The rule ``is_range_set`` states, without its one-key shortcut."""
    prev = None
    for lo, hi in value:
        if not (K.is_bound(lo) and K.is_bound(hi)) or not lo < hi:
            return False
        if prev is not None and not prev < lo:
            return False
        prev = hi
    return True


@given(_ranges)
@settings(max_examples=300)
def test_the_one_key_shortcut_agrees_with_the_rule(r):
    assert K.is_range_set((r,)) == _general((r,))


@given(_lookalikes)
@settings(max_examples=300)
def test_the_one_key_shortcut_tells_a_key_from_its_lookalikes(r):
    assert K.is_range_set((r,)) == _general((r,))


@pytest.mark.parametrize(
    "lo",
    [(2.0, 5), (True, 5), (2, 2**64), (2, -(2**63) - 1), (3, b"x"), (2, True), (3.0, "x")],
)
def test_the_one_key_shortcut_refuses_a_key_of_the_wrong_types(lo):
    """Its own checks of integer and string keys: a rank or a value equal to a right
    one, of another type, or an integer msgpack does not carry, is no key."""
    hi = (int(lo[0]), lo[1], 0)  # the exact after(): only the key itself is wrong
    assert not K.is_range_set(((lo, hi),))
    assert K.is_range_set((((2, 5), (2, 5, 0)),)) and K.is_range_set((((3, "x"), (3, "x", 0)),))


def test_a_flat_sort_form_shares_its_prefix_strings_and_not_its_last():
    """Keys decoded off the wire hold strings of their own; a tuple key's short strings
    before its last element (a view's name, a table's) are shared in the sort form, so
    an ordered map compares equal prefixes by identity; a last element (mostly unique)
    is not, and the table of shared strings is bounded."""
    from rubberband.keys import sort_key

    a = sort_key(("~view", b"view-name-x".decode(), (b"group".decode(), 1)))
    b = sort_key(("~view", b"view-name-x".decode(), (b"group".decode(), 2)))
    assert a[4] is b[4] and a[7] is b[7]
    last = b"unique-key-x".decode()
    assert sort_key(("t", last))[4] is last
    from rubberband import keys

    for i in range(keys.SHARED_STRINGS + 10):
        sort_key((f"field-{i}", i))
    assert len(keys._SHARED) == keys.SHARED_STRINGS


_one_type = st.sampled_from(
    [
        st.integers(min_value=K.MIN_INT, max_value=K.MAX_INT),
        st.one_of(st.integers(-3, 3), st.floats(-3, 3)),  # one rank: a float beside an int
        st.text(max_size=4),
        st.binary(max_size=4),
        key_values,  # any mix: tuples, bools, None
    ]
).flatmap(lambda keys: st.lists(keys, max_size=30))


@given(_one_type, st.randoms(use_true_random=False))
def test_sorted_pairs_are_in_key_order_whatever_their_keys(keys, rnd):
    pairs = [(k, i) for i, k in enumerate(keys)]
    rnd.shuffle(pairs)
    by_form = sorted(pairs, key=lambda p: K.encode_key(p[0]))
    K.sort_pairs(pairs)
    # Equal keys (1 and 1.0) may keep either order; the keys' order is the same.
    assert [K.encode_key(k) for k, _ in pairs] == [K.encode_key(k) for k, _ in by_form]
    assert sorted(pairs, key=lambda p: (K.encode_key(p[0]), p[1])) == sorted(
        by_form, key=lambda p: (K.encode_key(p[0]), p[1])
    )


def test_sorted_pairs_of_mixed_plain_types_keep_the_ranks():
    pairs = [("a", 0), (2, 1), (b"z", 2), (True, 3), (1.5, 4), (None, 5)]
    K.sort_pairs(pairs)
    assert [k for k, _ in pairs] == [None, True, 1.5, 2, "a", b"z"]


wide = st.integers(min_value=0, max_value=60)
long_range_sets = st.lists(st.tuples(wide, st.integers(1, 3)), max_size=30).map(
    lambda starts: _rs((a, a + n) for a, n in starts)  # short ones: many stay apart
)
short_range_sets = st.lists(st.tuples(wide, wide), max_size=4).map(_rs)


@given(long_range_sets, short_range_sets)
@settings(max_examples=400)
def test_few_ranges_against_many_are_checked_by_bisection_alike(many, few):
    """A handful of ranges against a long set (a write against the points of a storage
    process's queue) takes the bisection: the same answers as the sets say."""

    def members(rs):
        return {x for x in range(61) if K.contains(rs, (2, x))}

    for a, b in ((many, few), (few, many)):
        assert K.covers(a, b) == (members(b) <= members(a))
        assert K.overlaps(a, b) == bool(members(a) & members(b))


named_last = st.one_of(
    st.integers(min_value=K.MIN_INT - 5, max_value=K.MAX_INT + 5),
    st.text(max_size=4),
    st.tuples(),
    st.lists(
        st.one_of(st.integers(min_value=K.MIN_INT - 5, max_value=K.MAX_INT + 5),
                  st.text(max_size=4), st.none(), st.floats(allow_nan=True)),
        max_size=3,
    ).map(tuple),
    key_values,
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=5), st.text(max_size=5), named_last)
def test_a_named_key_is_spelled_as_every_tuple_is(a, b, last):
    """Keys ``(str, str, k)`` (a view's rows, a table's) take a road of their own in
    :func:`K.sort_key`: the same form as the general one, refused alike, and the two
    names shared as any prefix string is."""
    key = (a, b, last)
    try:
        out: list = [5]
        K._spell(key, out, 0)
        general: tuple | None = tuple(out)
    except K.BadKey:
        general = None
    if general is None:
        with pytest.raises(K.BadKey):
            K.sort_key(key)
        return
    assert K.sort_key(key) == general
    again = K.sort_key((a.encode().decode(), b.encode().decode(), last))
    if len(a) <= 64 and a in K._SHARED:
        assert again[2] is K._SHARED[a]
    if len(b) <= 64 and b in K._SHARED:
        assert again[4] is K._SHARED[b]


@settings(max_examples=300)
@given(st.lists(key_values, max_size=12), key_values)
def test_points_and_a_point_added_are_what_normalize_makes(ks, k):
    """``points`` (a write's point ranges, sorted by flat forms) and ``with_point`` (one
    more, by bisection) give what ``normalize`` gives, repeats and equal keys
    (``1`` and ``1.0``) included."""
    places = [K.encode_key(x) for x in ks]
    got = K.points(places)
    assert got == K.normalize((p, K.after(p)) for p in places)
    p = K.encode_key(k)
    assert K.with_point(got, p) == K.normalize([*got, (p, K.after(p))])


def test_a_key_given_in_json_has_its_arrays_as_tuples_and_a_command_line_reads_one() -> None:
    """An operator names a place among a view's rows (tuple keys) in JSON, which has
    no tuples: arrays become tuples at every level, other values stay as they are, and
    a list too deep for a key is refused as ``encode_key`` refuses the tuple."""
    json_key, text_key = K.json_key, K.text_key
    assert json_key(["~view", "by_city", ["M", 3]]) == ("~view", "by_city", ("M", 3))
    assert json_key(5) == 5 and json_key("abc") == "abc" and json_key([]) == ()
    deep: object = 1
    for _ in range(K.MAX_TUPLE_DEPTH + 1):
        deep = [deep]
    with pytest.raises(K.BadKey, match="nest at most"):
        json_key(deep)
    # A command line's (admin, client): an integer, a JSON array (a tuple key), else text.
    assert text_key("42") == 42 and text_key("b03000") == "b03000"
    assert text_key('["~view", "by_city", ["M"]]') == ("~view", "by_city", ("M",))
    assert text_key("[not json") == "[not json"
    with pytest.raises(K.BadKey, match="nest at most"):  # deeper than JSON decodes
        text_key("[" * 100_000 + "]" * 100_000)
