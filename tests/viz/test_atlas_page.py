"""``atlas.html`` without a browser: the page parses, fetches nothing, embeds the atlas exactly and safely, and its
size stays bounded (a fixed amount of code plus the JSON)."""

from __future__ import annotations

import html
import json
import math
import re
from html.parser import HTMLParser

import pytest

from _atlas import MARKUP, synthetic_atlas
from headwise.viz.atlas_page import atlas_card_html, atlas_html, write_atlas_page
from headwise.viz.notebook import atlas_view

SVG_NAMESPACE = "http://www.w3.org/2000/svg"  # the script's createElementNS argument: a name, never fetched


class _Page(HTMLParser):
    """Every start tag, and each ``<script>`` element's attributes and text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.scripts, self._in = [], [], None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "script":
            self._in = (dict(attrs), [])

    def handle_data(self, data):
        if self._in is not None:
            self._in[1].append(data)

    def handle_endtag(self, tag):
        if tag == "script" and self._in is not None:
            self.scripts.append((self._in[0], "".join(self._in[1])))
            self._in = None


def _parsed(page: str) -> _Page:
    p = _Page()
    p.feed(page)
    p.close()
    return p


def _data_block(page: str) -> str:
    blocks = [text for attrs, text in _parsed(page).scripts if attrs.get("id") == "atlas-data"]
    assert len(blocks) == 1
    return blocks[0]


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False)


def test_the_page_parses_and_embeds_the_atlas_exactly():
    atlas = synthetic_atlas(3, 4, markup=True)
    page = atlas_html(atlas)
    parsed = _parsed(page)
    assert parsed.tags.count("script") == 3  # the data, the options, the code: nothing from the data
    assert [a.get("type") for a, _ in parsed.scripts] == ["application/json", "application/json", None]
    assert "b" not in parsed.tags  # the markup token is no element
    back = json.loads(_data_block(page))
    assert _canonical(back) == _canonical(atlas)  # ints stay ints, every string as it was
    assert json.loads(parsed.scripts[1][1]) == {"open": None, "card_only": False}


def test_nothing_in_the_data_can_end_its_block_or_open_a_comment():
    atlas = synthetic_atlas(2, 2, markup=True)
    tricky = ["</SCRIPT >", "<!--", "-->", "a & b", "x\u2028y\u2029z", "<script>alert(1)</script>"]
    atlas["heads"][2]["contexts"][0]["tokens"][:6] = tricky
    atlas["model"]["name"] = "</script><!-- model"
    page = atlas_html(atlas)
    assert page.lower().count("</script") == 3  # the three blocks' own ends
    blob = _data_block(page)
    assert not set(blob) & set("<>&\u2028\u2029")
    assert "\\u003c/script\\u003e" in blob.lower()
    back = json.loads(blob)
    assert back["heads"][2]["contexts"][0]["tokens"][:6] == tricky and back["model"]["name"] == atlas["model"]["name"]


def test_no_resource_leaves_the_file():
    page = atlas_html(synthetic_atlas(4, 3, markup=True))
    assert page.count(SVG_NAMESPACE) == 1
    assert not re.search(r"https?://", page.replace(SVG_NAMESPACE, ""))
    assert not re.search(r"""(src|href|action)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert "@import" not in page and "url(" not in page
    tags = set(_parsed(page).tags)
    assert not tags & {"link", "img", "iframe", "object", "embed", "base", "audio", "video", "source"}
    assert "fetch(" not in page and "XMLHttpRequest" not in page and "import(" not in page


def _code_bytes(page: str) -> int:
    return len(page.encode()) - len(_data_block(page).encode())


@pytest.mark.parametrize(("layers", "heads", "bound"), [(30, 9, 1_200_000), (32, 32, 4_500_000)])
def test_the_size_is_the_code_plus_the_json(layers, heads, bound):
    atlas = synthetic_atlas(layers, heads, contexts=8, context_tokens=24)
    page = atlas_html(atlas)
    size = len(page.encode())
    blob = json.dumps(atlas, ensure_ascii=False, separators=(",", ":")).encode()
    assert size < bound, f"{layers} x {heads} heads: {size:,} bytes"
    assert _code_bytes(page) < 40_000  # a fixed amount of code, the same for every atlas
    assert len(_data_block(page).encode()) < 1.02 * len(blob)  # the escapes add little
    print(f"{layers} x {heads} heads: {size:,} bytes, of which code {_code_bytes(page):,}")


def test_the_code_is_the_same_whatever_the_atlas():
    small, large = atlas_html(synthetic_atlas(1, 2)), atlas_html(synthetic_atlas(6, 5, markup=True))
    assert _code_bytes(small) == _code_bytes(large)


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (lambda a: a.update(format="headwise.atlas/2"), ValueError, r"atlas: expected format .*'headwise.atlas/2'"),
        (lambda a: a.pop("format"), ValueError, r"atlas: .*got None"),
        (lambda a: a.update(heads={}), TypeError, "atlas: expected 'heads'"),
        (lambda a: a["heads"][1].update(id=a["heads"][0]["id"]), ValueError, "'L0.H0' appears twice"),
        (lambda a: a["heads"][2].update(layer=7), ValueError, "'L1.H0' has layer 7, the model has 2"),
        (lambda a: a["heads"][2].update(head=-1), ValueError, "'L1.H0' has head -1"),
        (lambda a: a["heads"][0]["stats"].update(entropy=math.nan), ValueError, "atlas: expected JSON values only"),
    ],
)
def test_a_malformed_atlas_is_named(change, error, message):
    atlas = synthetic_atlas(2, 2)
    change(atlas)
    with pytest.raises(error, match=message):
        atlas_html(atlas)


def test_not_a_dict_and_an_unknown_head_are_named():
    with pytest.raises(TypeError, match="atlas: expected a dict"):
        atlas_html([1, 2])
    with pytest.raises(ValueError, match="head_id: .*'L9.H9'"):
        atlas_card_html(synthetic_atlas(2, 2), "L9.H9")


def test_one_card_for_a_notebook_and_the_page_on_disk(tmp_path):
    atlas = synthetic_atlas(2, 3, markup=True)
    page = atlas_card_html(atlas, "L1.H2")
    assert json.loads(_parsed(page).scripts[1][1]) == {"open": "L1.H2", "card_only": True}
    assert _canonical(json.loads(_data_block(page))) == _canonical(atlas)
    view = atlas_view(atlas, head="L1.H2", height=500)
    frame = view._repr_html_()
    assert frame.startswith("<iframe") and 'sandbox="allow-scripts"' in frame
    assert html.unescape(frame.split('srcdoc="', 1)[1].rsplit('"', 1)[0]) == page
    assert atlas_view(atlas).page == atlas_html(atlas)
    path = write_atlas_page(atlas, tmp_path / "atlas.html")
    assert path.read_text(encoding="utf-8") == atlas_html(atlas)
    assert MARKUP not in page  # only its escaped form
