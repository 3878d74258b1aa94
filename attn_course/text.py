"""Text that a submission controls, made safe for a file or a terminal (placeholder; see helper)."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def plain(s: str, limit: int = 400, newlines: bool = False) -> str:
    s = str(s)
    if not newlines:
        s = s.replace("\n", " ")
    s = _CONTROL.sub("", s.replace("\r", ""))
    return s if len(s) <= limit else s[: max(0, limit - 1)] + "…"


def terminal(s: str, limit: int = 200) -> str:
    return plain(s, limit)


def md_inline(s: str, limit: int = 400) -> str:
    s = plain(s, limit)
    return re.sub(r"([\\`*_\[\]()#<>|!~{}+-])", r"\\\1", s)


def md_code_block(s: str, limit: int = 4000) -> str:
    s = plain(s, limit, newlines=True)
    fence = "`" * max(3, max((len(m) for m in re.findall(r"`+", s)), default=0) + 1)
    return f"{fence}text\n{s}\n{fence}"


def csv_cell(s: str) -> str:
    s = plain(s, 200)
    return "'" + s if s[:1] in ("=", "+", "-", "@", "\t", "\r") else s
