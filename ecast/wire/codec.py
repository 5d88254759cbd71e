"""The wire encoding of every message: msgpack, one extension code per message class.

Why extension types: a payload may itself be any msgpack value, so a dataclass must not
look like a list or a map.  Why an identity cache: the same object often goes to several
peers in one flush (an ``Accept`` to every follower); :class:`Encoder` packs each object
once per flush and splices the bytes wherever it appears (Python's cost is per message:
encode once).  Messages inside the hot containers are plain nested arrays, packed in C.

Decoding validates every field against the class's annotations (ints are ints, node ids
are strings, tuples are tuples of what they claim), so a malformed or hostile frame raises
:class:`DecodeError` here and never reaches a protocol core.
"""

from __future__ import annotations

import dataclasses
import threading
import types
import typing
from collections.abc import Callable
from operator import attrgetter
from typing import Any

import msgpack

from ecast.core import message as _message
from ecast.core import proto as _proto
from ecast.core.link import Frame
from ecast.core.ufabcast import messages as _ufab

MAX_FRAME = 16 * 1024 * 1024
"""Default largest frame a peer may send (16 MiB); larger ones close the connection."""


class DecodeError(ValueError):
    """A frame that is not a well-formed, known message; the peer gets disconnected."""


# Codes are part of the wire protocol: never renumber, only append.
_CLASSES: tuple[type, ...] = (
    # link
    Frame,
    # application messages
    _message.Submission,
    _message.Message,
    # ufabcast commands and messages
    _ufab.AppCmd,
    _ufab.JoinCmd,
    _ufab.PartCmd,
    _ufab.View,
    _ufab.Forward,
    _ufab.Prepare,
    _ufab.Promise,
    _ufab.Accept,
    _ufab.Accepted,
    _ufab.Nack,
    _ufab.Commit,
    _ufab.Heartbeat,
    _ufab.CatchUpRequest,
    _ufab.CatchUpReply,
    _ufab.JoinRequest,
    _ufab.Snapshot,
    _ufab.Parted,
    # E-Cast
    _proto.Hello,
    _proto.Route,
    _proto.RouteUnsafe,
    _proto.Confirm,
    _proto.CloseSessions,
    _proto.Deliver,
    _proto.DeliverUnsafe,
    _proto.Stable,
    _proto.RejectedClosed,
    _proto.SessionsClosed,
    _proto.Leader,
    _proto.Congestion,
    _proto.Suspected,
    _proto.RouteCmd,
    _proto.StableCmd,
    _proto.CloseSessionsCmd,
    _proto.Directory,
    _proto.Direct,
    # protocol v7
    _proto.Detach,
    _proto.Welcome,
    _proto.KeepAlive,
    # protocol v10
    _proto.UnsafeShed,
    # protocol v13
    _proto.Forbidden,
    _proto.CloseForbidden,
)
_CODE: dict[type, int] = {cls: i + 1 for i, cls in enumerate(_CLASSES)}


def _field_names(cls: type) -> tuple[str, ...]:
    if dataclasses.is_dataclass(cls):
        return tuple(f.name for f in dataclasses.fields(cls))
    return tuple(cls._fields)  # type: ignore[attr-defined]  # a NamedTuple


_FIELDS: dict[type, tuple[str, ...]] = {cls: _field_names(cls) for cls in _CLASSES}
"""NamedTuples (Message, Submission) keep their codes, but msgpack packs them as plain
arrays: they travel flattened inside the hot containers, or are rebuilt by their owner."""
EXTRA_CODE_BASE = 64
"""Codes from here on are for classes registered by layers above E-Cast (Rubberband)."""


def register(cls: type, code: int) -> None:
    """Let a layer above E-Cast put its own frozen dataclasses on the wire."""
    if code < EXTRA_CODE_BASE or code > 127:
        raise ValueError("extra codes live in 64..127")
    if code in _CODE.values() and _CODE.get(cls) != code:
        raise ValueError(f"code {code} is taken")
    _CODE[cls] = code
    _FIELDS[cls] = _field_names(cls)
    _GETTERS.pop(cls, None)
    _BY_CODE[code] = cls
    _DECODERS.pop(code, None)


_BY_CODE: dict[int, type] = {code: cls for cls, code in _CODE.items()}

register_message = register
"""The name layers above E-Cast know ``register`` by (``ecast.register_message``)."""


def plain_default(obj: Any) -> Any:
    """``default`` for a plain ``msgpack.Packer`` that packs registered messages as the
    wire does (an extension value per message, its fields nested), without an
    :class:`Encoder`'s per-flush cache: what a direct payload is packed with once, at the
    sender's size check, so it travels as those bytes (:class:`Packed`)."""
    cls = type(obj)
    code = _CODE.get(cls)
    if code is None or cls in _SPECIAL:
        raise TypeError(f"cannot encode {cls.__name__}")
    return _ext_new(msgpack.ExtType, (code, _plain_pack(_GETTERS[cls](obj))))


def _getter(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """An object's fields as one tuple, read in C (a Python loop of ``getattr`` per
    field was most of the cost of packing a small answer)."""
    if not names:
        return lambda obj: ()
    if len(names) == 1:
        one = attrgetter(names[0])
        return lambda obj: (one(obj),)
    return attrgetter(*names)  # type: ignore[return-value]


class _Getters(dict[type, Callable[[Any], tuple[Any, ...]]]):
    """Each registered class's :func:`_getter`, made at its first use."""

    def __missing__(self, cls: type) -> Callable[[Any], tuple[Any, ...]]:
        get = self[cls] = _getter(_FIELDS[cls])
        return get


_GETTERS = _Getters()


def _plain_pack(value: Any) -> bytes:
    """A nested message's fields (a message inside another's fields: rare, so a fresh
    Packer, which is re-entrant where a reused one is not)."""
    return msgpack.packb(value, default=plain_default, use_bin_type=True)  # type: ignore[no-any-return]


class _PlainPackers(threading.local):
    """This thread's two Packers for :func:`pack_plain` (a Packer is not safe to share
    between threads, and ``msgpack.packb`` builds one per call: three times the cost)."""

    def __init__(self) -> None:
        self.outer = msgpack.Packer(default=plain_default, use_bin_type=True).pack
        self.fields = msgpack.Packer(default=plain_default, use_bin_type=True).pack


_plain = _PlainPackers()


def pack_plain(value: Any) -> bytes:
    """``value`` packed as :func:`plain_default` packs it, the usual case (one registered
    message, as a direct payload) without a ``default`` call back from C: its fields
    packed by one reused Packer and the extension's header written here.  A six-field
    answer packs in about 1.3 µs this way, against 5 µs through ``plain_default`` with
    a fresh Packer (msgpack 1.x, 2026-11-29): what every direct message costs its
    sender."""
    packers = _plain
    cls = type(value)
    code = _CODE.get(cls)
    if code is None or cls in _SPECIAL:
        return packers.outer(value)  # type: ignore[no-any-return]
    data: bytes = packers.fields(_GETTERS[cls](value))
    if len(data) > PACKER_BUFFER:  # let go of the grown buffer
        packers.fields = msgpack.Packer(default=plain_default, use_bin_type=True).pack
    return _ext_header(code, len(data)) + data


def _ext_header(code: int, n: int) -> bytes:
    """msgpack's header of an extension value of ``n`` bytes, as msgpack writes it."""
    fixed = _FIXEXT.get(n)
    if fixed is not None:
        return bytes((fixed, code))
    if n < 0x100:
        return bytes((0xC7, n, code))
    if n < 0x10000:
        return b"\xc8" + n.to_bytes(2, "big") + bytes((code,))
    return b"\xc9" + n.to_bytes(4, "big") + bytes((code,))


_FIXEXT = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}


# ------------------------------------------------------------------ validation
# Each class gets a decoder generated from its annotations: one function with the type
# checks written out inline.  A generic loop of one predicate per field cost more than
# unpacking and building the object together (a third of a follower's CPU was decoding).


def _check_expr(tp: Any, var: str, owner: type, ns: dict[str, Any], depth: int = 0) -> str:
    """A Python expression that is true when ``var`` is a valid value of annotation ``tp``."""
    if tp is Any or tp is typing.Any or tp is object:
        return "True"
    if tp is int:
        return f"type({var}) is int"
    if tp is float:
        return f"(type({var}) is float or type({var}) is int)"
    if tp in (bool, str, bytes):
        return f"type({var}) is {tp.__name__}"
    if tp is type(None):
        return f"{var} is None"
    if dataclasses.is_dataclass(tp):
        name = f"_T_{tp.__name__}"
        ns[name] = tp
        return f"type({var}) is {name}"
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return "(" + " or ".join(_check_expr(a, var, owner, ns, depth) for a in args) + ")"
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            item = f"_x{depth}"
            each = _check_expr(args[0], item, owner, ns, depth + 1)
            if each == "True":
                return f"type({var}) is tuple"
            return f"(type({var}) is tuple and all({each} for {item} in {var}))"
        if not args:
            return f"type({var}) is tuple"
        parts = [f"type({var}) is tuple", f"len({var}) == {len(args)}"]
        parts += [_check_expr(a, f"{var}[{i}]", owner, ns, depth) for i, a in enumerate(args)]
        return "(" + " and ".join(parts) + ")"
    if origin is dict:
        return f"type({var}) is dict"
    raise TypeError(f"codec: no validator for {tp!r} in {owner.__name__}")


def _bad_fields(cls: type, fields: Any, checks: tuple[Callable[[Any], bool], ...]) -> DecodeError:
    """The error for a refused message, naming the first bad field (the slow path)."""
    names = _FIELDS[cls]
    if type(fields) is not tuple or len(fields) != len(names):
        return DecodeError(f"{cls.__name__}: expected {len(names)} fields")
    for name, check, value in zip(names, checks, fields, strict=True):
        if not check(value):
            return DecodeError(f"{cls.__name__}.{name}: bad value {value!r:.60}")
    return DecodeError(f"{cls.__name__}: bad field values {fields!r:.80}")


def _slot_setters(cls: type, names: tuple[str, ...], ns: dict[str, Any]) -> bool:
    """Put in ``ns`` a setter per field (``_set0`` ...) and ``_new`` if instances of
    ``cls`` can be built by setting their slots, with the same result as ``__init__``: a
    dataclass with slots and fields only, no ``__post_init__`` and no other init logic."""
    if not dataclasses.is_dataclass(cls) or hasattr(cls, "__post_init__") or not names:
        return False
    setters = []
    for name in names:
        slot = cls.__dict__.get(name)
        if type(slot) is not types.MemberDescriptorType:
            return False
        setters.append(slot.__set__)
    if not cls.__dataclass_params__.init or any(  # type: ignore[attr-defined]
        not f.init for f in dataclasses.fields(cls)
    ):
        return False
    ns["_new"] = object.__new__
    for i, setter in enumerate(setters):
        ns[f"_set{i}"] = setter
    return True


def _make_decoder(cls: type) -> Callable[[Any], Any]:
    module = __import__(cls.__module__, fromlist=["_"])
    hints = typing.get_type_hints(cls, vars(module))
    names = _FIELDS[cls]
    ns: dict[str, Any] = {"_cls": cls, "_bad": _bad_fields}
    args = [f"a{i}" for i in range(len(names))]
    checks = [_check_expr(hints[n], a, cls, ns) for n, a in zip(names, args, strict=True)]
    cond = " and ".join(c for c in checks if c != "True") or "True"
    field_checks = [f"lambda {a}: {c}" for a, c in zip(args, checks, strict=True)]
    unpack_line = f"        {', '.join(args)}, = f" if args else ""
    build = f"            return _cls({', '.join(args)})"
    if _slot_setters(cls, names, ns):
        # A frozen dataclass's __init__ sets each field through object.__setattr__: for
        # a six-field answer that was most of its decoding.  Its slots are set directly.
        sets = "; ".join(f"_set{i}(o, {a})" for i, a in enumerate(args))
        build = f"            o = _new(_cls); {sets}; return o"
    src = "\n".join(
        [
            "def decode(f):",
            f"    if type(f) is tuple and len(f) == {len(names)}:",
            unpack_line,
            f"        if {cond}:",
            build,
            "    raise _bad(_cls, f, _checks)",
            f"_checks = ({', '.join(field_checks)}{',' if field_checks else ''})",
        ]
    )
    exec(compile(src, f"<decoder {cls.__name__}>", "exec"), ns)
    return ns["decode"]  # type: ignore[no-any-return]


# ------------------------------------------------------------------ hot classes
# Messages travel by the thousand inside a few container types.  Those containers are
# packed as they are: a Message or Submission is a tuple, so msgpack writes it as a nested
# array in C, with no Python code per message on the sending side.  On the receiving side
# msgpack has already built every tuple but the outer NamedTuple; one tight loop checks
# the shape and leaf types and turns each tuple into its class in one step.  (Flattened
# arrays, the earlier layout, cost a Python-built tuple per copy on the leader and four
# more per message at each receiver to rebuild the nesting.)

_M = _message.Message
_tnew = _message.fast_new
_S = _message.Submission
_SHAPE = (TypeError, ValueError)
"""What unpacking a value of the wrong shape raises (every value here came from msgpack,
so iterating it runs no foreign code)."""


def _bad(cls: type, value: Any) -> DecodeError:
    return DecodeError(f"{cls.__name__}: bad item {value!r:.80}")


def _id_loop(name: str, unpack: str, checks: str, keep: str, result: str) -> Any:
    """Generates one hot decoding loop that checks every item's message id.

    Each hot container's items carry a message id ``((ns, epoch, stream), seq)`` among
    other fields; their loops differ only in how an item unpacks, what else they check
    and what they keep.  The loops stay written out in the generated code, with no call
    per item (docs/decisions.md, "Hot loops keep written-out copies"), but their source
    is this one template: ``unpack`` binds ``sid`` from the item ``x``, ``checks`` adds
    ``or``-ed refusals, ``keep`` is the statement per good item, ``result`` the return
    value built from ``out`` (or ``data``).
    """
    src = f"""
def {name}(data, cls):
    out = []
    append = out.append
    for x in data:
        try:
            {unpack}
            sess, seq = sid
            ns, epoch, stream = sess
        except _SHAPE:
            raise _bad(cls, x) from None
        if (
            type(x) is not tuple
            or type(sid) is not tuple
            or type(sess) is not tuple
            or type(ns) is not str
            or type(epoch) is not int
            or type(stream) is not str
            or type(seq) is not int
            {checks}
        ):
            raise _bad(cls, x)
        {keep}
    return {result}
"""
    ns = {"_SHAPE": _SHAPE, "_bad": _bad, "_tnew": _tnew, "_M": _M, "_S": _S}
    exec(compile(src, f"<decoder loop {name}>", "exec"), ns)
    return ns[name]


_msgs = _id_loop(
    "_msgs",
    unpack="sender, sid, _h, _p = x",
    checks="or type(sender) is not str",
    keep="append(_tnew(_M, x))",
    result="out",
)
"""Messages ``(sender, ((ns, epoch, stream), seq), header, payload)``, checked and made
:class:`Message` in one loop (every route a follower learns passes here)."""

_subs = _id_loop(
    "_subs",
    unpack="sid, _h, _p = x",
    checks="",
    keep="append(_tnew(_S, x))",
    result="tuple(out)",
)

_deliver_items = _id_loop(
    "_deliver_items",
    unpack="t, m = x; sender, sid, _h, _p = m",
    checks="or type(m) is not tuple or type(t) is not int or type(sender) is not str",
    keep="append((t, _tnew(_M, m)))",
    result="tuple(out)",
)
"""``(t, message)`` items: every copy a receiver gets passes here."""

_stable_acks = _id_loop(
    "_stable_acks",
    unpack="sid, t, d = x",
    checks="or (t is not None and type(t) is not int) or type(d) is not bool",
    keep="pass",
    result="data",
)
"""An ack arrives as the plain tuple ``(((ns, epoch, stream), seq), t, delivered)`` the
endpoint wants: checked, it is kept as it is."""


def _dec_deliver(data: Any) -> Any:
    return _proto.Deliver(_deliver_items(data, _proto.Deliver))


def _dec_stable(data: Any) -> Any:
    return _proto.Stable(_stable_acks(data, _proto.Stable))


DELIVER_REFS = EXTRA_CODE_BASE - 1
"""The extension code of a ``Deliver`` whose messages are indexes into its packet's
message table (wire protocol v6; see ``Encoder.pack_packet``)."""

TABLE = "m"
"""The kind of the packet item that carries the message table: ``("m", (msg, ...))``."""


_decoding = threading.local()
"""Per thread: how many ``Deliver`` by reference the current packet decoded (each must be
resolved, i.e. stand in a frame's messages of a packet with a table)."""


class _Refs:
    """A ``Deliver`` by reference, as decoded, until its packet's table resolves it."""

    __slots__ = ("items",)

    def __init__(self, items: tuple[tuple[int, int], ...]) -> None:
        self.items = items


def _dec_deliver_refs(data: Any) -> _Refs:
    if type(data) is not tuple:
        raise DecodeError("Deliver: expected a sequence")
    for x in data:
        if type(x) is not tuple or len(x) != 2 or type(x[0]) is not int or type(x[1]) is not int:
            raise _bad(_proto.Deliver, x)
    _decoding.refs = getattr(_decoding, "refs", 0) + 1
    return _Refs(data)


def begin_packet() -> None:
    _decoding.refs = 0


def end_packet() -> None:
    """Every ``Deliver`` by reference must have been resolved by its packet's table."""
    if _decoding.refs:
        raise DecodeError("a Deliver by reference outside a frame of a packet with a table")


def decode_message_table(data: Any) -> list[Any]:
    """A packet's message table (``ecast.wire.packet``), checked like routed messages."""
    if type(data) is not tuple:
        raise DecodeError("a packet's message table is an array")
    return _msgs(data, _proto.Deliver)  # type: ignore[no-any-return]


def resolve_references(msgs: tuple[Any, ...], table: list[Any]) -> tuple[Any, ...]:
    """A frame's messages with every ``Deliver`` by reference made a ``Deliver``."""
    n = len(table)
    out = []
    for x in msgs:
        if type(x) is _Refs:
            _decoding.refs -= 1
            items = []
            for t, i in x.items:
                if not 0 <= i < n:
                    raise DecodeError(f"Deliver: index {i} outside the packet's table of {n}")
                items.append((t, table[i]))
            x = _proto.Deliver(tuple(items))
        out.append(x)
    return tuple(out)


def _dec_unsafe(data: Any) -> Any:
    for x in data:
        if (
            type(x) is not tuple
            or len(x) != 3
            or (x[0] is not None and type(x[0]) is not int)
            or type(x[1]) is not int
        ):
            raise _bad(_proto.DeliverUnsafe, x)
    msgs = _msgs([x[2] for x in data], _proto.DeliverUnsafe)
    return _proto.DeliverUnsafe(tuple((x[0], x[1], m) for x, m in zip(data, msgs, strict=True)))


def _dec_routecmd(data: Any) -> Any:
    return _proto.RouteCmd(tuple(_msgs(data, _proto.RouteCmd)))


def _dec_route(data: Any) -> Any:
    return _proto.Route(_subs(data, _proto.Route))


def _dec_route_unsafe(data: Any) -> Any:
    return _proto.RouteUnsafe(_subs(data, _proto.RouteUnsafe))


def _dec_stablecmd(data: Any) -> Any:
    for x in data:
        if type(x) is not tuple or len(x) != 2 or type(x[0]) is not int or type(x[1]) is not bool:
            raise _bad(_proto.StableCmd, x)
    return _proto.StableCmd(data)


# Each hot container has one field, a tuple of tuples, packed as it is.
_SPECIAL: dict[type, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    _proto.StableCmd: (attrgetter("entries"), _dec_stablecmd),
    _proto.Deliver: (attrgetter("items"), _dec_deliver),
    _proto.DeliverUnsafe: (attrgetter("items"), _dec_unsafe),
    _proto.RouteCmd: (attrgetter("msgs"), _dec_routecmd),
    _proto.Route: (attrgetter("subs"), _dec_route),
    _proto.RouteUnsafe: (attrgetter("subs"), _dec_route_unsafe),
    _proto.Stable: (attrgetter("acks"), _dec_stable),
}
_SPECIAL_DEC: dict[int, Callable[[Any], Any]] = {_CODE[c]: d for c, (_e, d) in _SPECIAL.items()}


# ------------------------------------------------------------------ encoding
_ext_new = tuple.__new__
"""Builds an ``ExtType`` without its Python-level ``__new__`` checks: our codes are valid
and our data is ``bytes`` by construction."""


PACKER_BUFFER = 512 * 1024
"""Every Packer gets a buffer of this size, with its pages touched when it is made.
msgpack grows a buffer to twice the largest object packed and never shrinks it, so a
Packer whose output outgrew this is replaced.  Both halves matter for flat memory: left
at their high-water mark, the leader's packers grew in steps to about 600 KiB each as
ever larger Paxos instances came by (2.2 MB of its RSS at a random moment of a run).
And the buffers are not small to save memory: a small buffer grown and dropped per large
instance page-faulted its way up again each time, which doubled the cost of encoding an
``Accept`` (0.6 to 1.3 µs per message)."""

_TOUCH = bytes(PACKER_BUFFER - 8)
"""Packed once into a new Packer's buffer (bin 32 adds 5 bytes) so all its pages are
resident from the start rather than faulted in, one step of RSS at a time, later."""


@dataclasses.dataclass(frozen=True, slots=True)
class Packed:
    """A ``Direct`` payload already packed (plain msgpack values, ``use_bin_type``): the
    sender's size check packs every direct payload anyway, and the encoder splices these
    bytes in instead of packing the payload a second time.  On the wire the ``Direct``
    is exactly what it would have been; a node hands a colocated peer's ``Packed``
    payload over unpacked (:meth:`unpacked`)."""

    data: bytes

    def unpacked(self) -> Any:
        return unpack(self.data)


_DIRECT = _CODE[_proto.Direct]


class Encoder:
    """Packs messages; objects seen earlier in the same flush are not packed again."""

    __slots__ = ("__dict__", "_cache", "_depth", "_keep", "_packers", "_table", "_table_msgs")

    def __init__(self) -> None:
        self._cache: dict[int, msgpack.ExtType] = {}
        self._keep: list[Any] = []  # keeps cached objects alive so ids stay unique
        self._packers: list[Callable[[Any], bytes]] = []
        self._depth = 0
        self._table: dict[int, int] | None = None
        """While a packet is packed: its message table, message ``id`` -> index."""
        self._table_msgs: list[Any] = []
        # One reusable Packer (msgpack.packb builds a new one per call).
        self._packer = self._new_packer()

    def _new_packer(self) -> Callable[[Any], bytes]:
        pack = msgpack.Packer(default=self._default, use_bin_type=True, buf_size=PACKER_BUFFER).pack
        pack(_TOUCH)
        return pack

    def _default(self, obj: Any) -> Any:
        key = id(obj)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        cls = type(obj)
        if cls is _proto.Deliver and self._table is not None and self._depth == 0:
            # Only a Deliver that is one of a frame's messages, where the decoder
            # resolves references; one inside another object (a Direct's payload)
            # stays inline.
            return self._deliver_refs(obj)
        if cls is _proto.Direct and type(obj.payload) is Packed:
            # A one-field message is an array of one: 0x91, then the field.
            ext = _ext_new(msgpack.ExtType, (_DIRECT, b"\x91" + obj.payload.data))
            self._cache[key] = ext
            self._keep.append(obj)
            return ext
        code = _CODE.get(cls)
        if code is None:
            raise TypeError(f"cannot encode {cls.__name__}")
        special = _SPECIAL.get(cls)
        fields = special[0](obj) if special else _GETTERS[cls](obj)
        ext = _ext_new(msgpack.ExtType, (code, self._pack_nested(fields)))
        self._cache[key] = ext
        self._keep.append(obj)
        return ext

    def _pack_nested(self, value: Any) -> bytes:
        """Pack an object's fields with the Packer of the current nesting depth.

        One Packer per depth, reused: allocating and touching a new buffer per object cost
        more than the packing itself.  One whose output outgrew its buffer is replaced
        (``PACKER_BUFFER``)."""
        depth = self._depth
        packers = self._packers
        if depth == len(packers):
            packers.append(self._new_packer())
        self._depth = depth + 1
        try:
            data = packers[depth](value)
        finally:
            self._depth = depth
        if len(data) > PACKER_BUFFER:
            packers[depth] = self._new_packer()
        return data

    def _deliver_refs(self, obj: Any) -> Any:
        # Not cached: the indexes are only good within this packet.
        table = self._table
        assert table is not None
        msgs = self._table_msgs
        refs = []
        append = refs.append
        for t, m in obj.items:
            i = table.get(id(m))
            if i is None:
                i = table[id(m)] = len(msgs)
                msgs.append(m)  # keeps it alive, so its id stays unique
            append((t, i))
        return _ext_new(msgpack.ExtType, (DELIVER_REFS, self._pack_nested(refs)))

    def pack_packet(self, items: list[Any]) -> list[bytes]:
        """The packed items of one packet, led by its message table if it needs one.

        A packet to a process that hosts many receivers carries each message to several
        of them (three of sixteen in the benchmark).  Packed inline, every copy cost the
        leader a full pack of the message (its fields scattered over the heap) and the
        receiving process a full decode and check.  Now each ``Deliver`` in the packet
        names its messages by index into one table that holds each message once (wire
        protocol v6); the table is packed first, so the decoder has it when it meets the
        references.  ``decode_packet`` resolves them; the items never leave the packet
        with references in them.
        """
        self._table = {}
        try:
            parts = [self.pack(item) for item in items]
            msgs = self._table_msgs
            if msgs:
                parts.insert(0, self.pack((TABLE, tuple(msgs))))
        finally:
            self._table = None
            self._table_msgs = []
        return parts

    def pack(self, obj: Any) -> bytes:
        data = self._packer(obj)
        if len(data) > PACKER_BUFFER:
            self._packer = self._new_packer()
        return data

    def reset(self) -> None:
        """Forget cached encodings (call once per flush)."""
        self._cache.clear()
        self._keep.clear()


def _decoder(code: int) -> Callable[[Any], Any]:
    cls = _BY_CODE.get(code)
    if cls is None:
        raise DecodeError(f"unknown message type code {code}")
    special = _SPECIAL_DEC.get(code)
    if special is not None:

        def decode(fields: Any, special: Callable[[Any], Any] = special) -> Any:
            if type(fields) is not tuple:
                raise DecodeError(f"{cls.__name__}: expected a sequence")
            return special(fields)

    else:
        decode = _make_decoder(cls)
    _DECODERS[code] = decode
    return decode


_DECODERS: dict[int, Callable[[Any], Any]] = {DELIVER_REFS: _dec_deliver_refs}
_unpackb = msgpack.unpackb

MAX_NESTING = 24
"""How deep extension values (messages) may nest inside one another.

msgpack decodes an extension value's data with a nested ``unpackb`` call, made from C
through ``ext_hook``: each level of nesting costs C stack that Python's recursion limit
does not see, and about 200 nested ``Direct`` values (under a kilobyte) crashed a router
with SIGSEGV.  The deepest nesting E-Cast itself sends is four (a frame's ``Accept``
holds ``AppCmd`` s holding a ``RouteCmd``; a ``Snapshot`` holds a ``View``); the rest is
room for the classes and payloads of the layers above."""


def _nesting_hooks() -> Callable[[int, bytes], Any]:
    """The ``ext_hook`` of the outermost extension value: one hook per nesting level,
    each decoding its value's data with the next level's hook, and past ``MAX_NESTING``
    one that refuses.

    The depth lives in which hook runs, not in a counter: a thread-local counter read and
    written around every extension value cost about 1.4 µs per value, more than decoding
    a small message (a router's confirmations and acceptances are little else)."""

    def too_deep(code: int, data: bytes) -> Any:
        raise DecodeError(f"messages nested deeper than {MAX_NESTING}")

    def level(inner: Callable[[int, bytes], Any]) -> Callable[[int, bytes], Any]:
        def hook(code: int, data: bytes) -> Any:
            decode = _DECODERS.get(code)
            if decode is None:
                decode = _decoder(code)
            return decode(
                _unpackb(data, ext_hook=inner, use_list=False, raw=False, strict_map_key=False)
            )

        return hook

    hook = too_deep
    for _ in range(MAX_NESTING):
        hook = level(hook)
    return hook


_ext_hook = _nesting_hooks()


def unpack(data: bytes | memoryview) -> Any:
    """Decode one packed value; any malformation becomes :class:`DecodeError`."""
    try:
        return msgpack.unpackb(
            data, ext_hook=_ext_hook, use_list=False, raw=False, strict_map_key=False
        )
    except DecodeError:
        raise
    except (
        ValueError,
        TypeError,
        msgpack.ExtraData,
        msgpack.FormatError,
        msgpack.StackError,
        RecursionError,
    ) as e:
        raise DecodeError(f"malformed: {e}") from None


def pack(obj: Any) -> bytes:
    """Encode one value without a shared cache (tests, handshakes)."""
    return Encoder().pack(obj)
