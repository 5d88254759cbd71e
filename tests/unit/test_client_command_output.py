"""``rubberband client`` prints what engines store, bytes included, as text or JSON."""

from __future__ import annotations

import json

from rubberband.tools.client import _table_text, jsonable


def test_bytes_print_as_text_or_base64_in_tables_and_json() -> None:
    rows = [[1, b"hello"], [2, b"\xff\x00"], [3, (b"a", {"k": b"v"})], [4, None]]
    shown = jsonable({"columns": ["key", "value"], "rows": rows})
    assert shown["rows"] == [
        [1, "hello"],
        [2, "base64:/wA="],
        [3, ["a", {"k": "v"}]],
        [4, None],
    ]
    assert json.loads(json.dumps(shown)) == shown  # plain JSON, no "b'...'" strings
    text = _table_text(shown["columns"], shown["rows"])
    assert "hello" in text and "base64:/wA=" in text and "b'" not in text
    assert text.endswith("(4 rows)")


def test_the_shell_completes_commands_flags_and_isolation_levels() -> None:
    from rubberband.tools.client_shell import completions

    assert completions("", "")[:3] == ["get", "put", "append"]
    assert completions("de", "de") == ["delete", "delete-rows"]
    assert completions("get 1 --is", "--is") == ["--isolation"]
    assert completions("get 1 --isolation ", "") == ["sequential", "snapshot", "basic"]
    assert completions("get 1 --isolation sn", "sn") == ["snapshot"]
    assert completions("get 1", "1") == []
