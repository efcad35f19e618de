"""Issue 27 item 6: no run of ten or more same-shape lines between two DTLS files.

Each line of code is reduced to its shape: names become ``N``, string and bytes
literals ``S``, numbers ``0``; keywords, operators and brackets stay. Blank lines,
comments, docstrings and import statements are not code and are left out (what two files
import in common is not a copy). Two files share a copy when the same sequence of
:data:`MIN_RUN` shapes occurs in both and has at least :data:`MIN_DISTINCT` different
shapes in it: a run that repeats one or two shapes (``N = 0`` down an enum, the wire
code points of two RFCs) is a table, not copied logic.
"""

from __future__ import annotations

import io
import keyword
import token
import tokenize
from pathlib import Path

import appliance.proto.dtls

MIN_RUN = 10
MIN_DISTINCT = 5
DTLS = Path(appliance.proto.dtls.__file__).parent


def shapes(source: str) -> list[tuple[int, str]]:
    """(line number, shape) for every line of code in ``source``."""
    lines: dict[int, list[str]] = {}
    skip: set[int] = set()
    prev = token.NEWLINE
    in_import = False
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        kind, text, (row, _), (end_row, _), _ = tok
        if kind in (tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT,
                    tokenize.ENCODING, tokenize.ENDMARKER):
            continue
        starts_statement = prev in (token.NEWLINE, token.INDENT, token.DEDENT)
        if kind == token.NEWLINE:
            prev = kind
            in_import = False
            continue
        if starts_statement:
            in_import = kind == token.NAME and text in ("import", "from")
            if kind == token.STRING:  # a docstring or a bare string statement
                skip.update(range(row, end_row + 1))
        if in_import:
            skip.update(range(row, end_row + 1))
        prev = kind
        if kind == token.NAME:
            shape = text if keyword.iskeyword(text) or text in ("self", "None") else "N"
        elif kind == token.STRING or kind in _FSTRING_KINDS:
            shape = "S"
        elif kind == token.NUMBER:
            shape = "0"
        else:
            shape = text
        lines.setdefault(row, []).append(shape)
    return [(row, " ".join(parts)) for row, parts in sorted(lines.items()) if row not in skip]


_FSTRING_KINDS = {getattr(token, n) for n in ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END")
                  if hasattr(token, n)}


def _squash(seq: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Merge f-string pieces (``S S S``) into one ``S`` so they compare like strings."""
    out = []
    for row, shape in seq:
        while "S S" in shape:
            shape = shape.replace("S S", "S")
        out.append((row, shape))
    return out


def common_runs(a: list[tuple[int, str]], b: list[tuple[int, str]],
                min_run: int = MIN_RUN) -> list[tuple[int, int, int]]:
    """(line in a, line in b, length) of every maximal run of equal shapes."""
    index: dict[tuple[str, ...], list[int]] = {}
    sb = [s for _, s in b]
    for j in range(len(sb) - min_run + 1):
        index.setdefault(tuple(sb[j:j + min_run]), []).append(j)
    sa = [s for _, s in a]
    runs = []
    for i in range(len(sa) - min_run + 1):
        for j in index.get(tuple(sa[i:i + min_run]), ()):
            if i and j and sa[i - 1] == sb[j - 1]:
                continue  # not maximal: the run started earlier
            n = min_run
            while i + n < len(sa) and j + n < len(sb) and sa[i + n] == sb[j + n]:
                n += 1
            if len(set(sa[i:i + n])) >= MIN_DISTINCT:
                runs.append((a[i][0], b[j][0], n))
    return runs


def test_shapes_see_a_renamed_copy() -> None:
    # Twelve lines of distinct shapes (line i calls with i arguments).
    body = "".join(f"    v{i} = f(x{', 7' * i})\n" for i in range(12))
    one = shapes(f'def a(x):\n    """doc"""\n{body}')
    two = shapes(f"import os\n\ndef b(y):\n    # note\n{body.replace('f(', 'g(')}")
    assert common_runs(_squash(one), _squash(two)) == [(1, 3, 13)]
    assert common_runs(_squash(one[:9]), _squash(two)) == []


def test_a_table_is_not_a_copy() -> None:
    one = shapes("".join(f"A{i} = {i}\n" for i in range(12)))
    two = shapes("".join(f"B{i} = {i * 7}\n" for i in range(12)))
    assert common_runs(one, two) == []


def test_no_copies_between_dtls_files() -> None:
    files = sorted(DTLS.rglob("*.py"))
    assert len(files) > 5
    seqs = {f: _squash(shapes(f.read_text())) for f in files}
    found = []
    for n, a in enumerate(files):
        for b in files[n + 1:]:
            for la, lb, length in common_runs(seqs[a], seqs[b]):
                found.append(f"{a.relative_to(DTLS)}:{la} ~ {b.relative_to(DTLS)}:{lb} ({length} lines)")
    assert not found, "same-shape runs between DTLS files:\n" + "\n".join(found)
