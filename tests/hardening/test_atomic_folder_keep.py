"""``atomic_folder(path, keep=…)``: a resumable run's entries of the old folder move into the new one at the swap,
and stay where they were when the block fails."""

import pytest

from headwise._io import atomic_folder


def _old(tmp_path):
    out = tmp_path / "out"
    (out / "shards").mkdir(parents=True)
    (out / "shards" / "shard-0.safetensors").write_text("sums")
    (out / "patching.json").write_text("old")
    return out


def test_kept_entries_move_into_the_new_folder(tmp_path):
    out = _old(tmp_path)
    with atomic_folder(out, keep=("shards",)) as folder:
        (folder / "patching.json").write_text("new")
    assert sorted(p.name for p in out.iterdir()) == ["patching.json", "shards"]
    assert (out / "patching.json").read_text() == "new"
    assert (out / "shards" / "shard-0.safetensors").read_text() == "sums"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # nothing left beside it


def test_without_keep_the_old_entries_go(tmp_path):
    out = _old(tmp_path)
    with atomic_folder(out) as folder:
        (folder / "patching.json").write_text("new")
    assert sorted(p.name for p in out.iterdir()) == ["patching.json"]


def test_a_failed_block_leaves_the_kept_entries_in_place(tmp_path):
    out = _old(tmp_path)
    with pytest.raises(RuntimeError), atomic_folder(out, keep=("shards",)) as folder:
        (folder / "patching.json").write_text("new")
        raise RuntimeError("interrupted")
    assert (out / "patching.json").read_text() == "old"
    assert (out / "shards" / "shard-0.safetensors").read_text() == "sums"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
