"""``circuit.png`` and the reading of circuit dicts: the placement in layers, the edges drawn, bad input."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from _circuit_dicts import make_circuit
from _pictures import assert_not_blank, read_png
from headwise.viz.circuit import MLP_X, _drawn, check_circuit, circuit_layout, edge_scores, plot_circuit

SHAPES = {
    "gqa": dict(layers=2, heads=4, kv_groups=2),
    "no_mlp": dict(layers=3, heads=2, kv_groups=None, mlp=False),
    "one_layer": dict(layers=1, heads=3, kv_groups=1),
    "many_layers": dict(layers=30, heads=9, kv_groups=3, tokens=12, keep=40),
}


def _ink(image: np.ndarray, colour: str) -> int:
    """Pixels clearly red (r > g + 0.3, r > b + 0.3) or blue (b > r + 0.3)."""
    r, g, b = image[..., 0], image[..., 1], image[..., 2]
    mask = (r > g + 0.3) & (r > b + 0.3) if colour == "red" else (b > r + 0.3) & (b > g + 0.15)
    return int(mask.sum())


@pytest.mark.parametrize(
    "shape", [pytest.param(s, marks=pytest.mark.slow) if s == "many_layers" else s for s in sorted(SHAPES)]
)
def test_every_shape_draws_a_picture_of_the_stated_size(shape, tmp_path):
    d = make_circuit(**SHAPES[shape])
    picture = plot_circuit(d, tmp_path / "circuit.png", dpi=50)
    image = read_png(tmp_path / "circuit.png")
    assert image.shape[:2] == (picture.height, picture.width)
    assert_not_blank(image)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["circuit.png"]  # nothing half-written left


def test_the_layout_stacks_embeddings_layers_and_logits():
    d = make_circuit(layers=2, heads=4, kv_groups=2)
    pos, rows = circuit_layout(d["nodes"])
    assert rows == ["embed", "L0 kv", "L0 heads", "L0 MLP", "L1 kv", "L1 heads", "L1 MLP", "logits"]
    assert pos["embed"] == (0.5, 0.0) and pos["logits"] == (0.5, 7.0)
    assert [pos[f"L1.H{h}"] for h in range(4)] == [(0.125, 5.0), (0.375, 5.0), (0.625, 5.0), (0.875, 5.0)]
    assert pos["L1.KV0"] == (0.25, 4.0) and pos["L1.KV1"] == (0.75, 4.0)  # under the two heads each group serves
    assert pos["L0.MLP"] == (MLP_X, 3.0) and MLP_X > 1
    # Every edge goes up the picture (a sender always sits below its receiver).
    for e in d["edges"]:
        assert pos[e["sender"]][1] < pos[e["receiver"]][1], e
    pos, rows = circuit_layout(make_circuit(layers=3, heads=2, kv_groups=None, mlp=False)["nodes"])
    assert rows == ["embed", "L0 heads", "L1 heads", "L2 heads", "logits"] and pos["L2.H1"] == (0.75, 3.0)


def test_the_circuit_and_the_strongest_edges_are_drawn():
    d = make_circuit(layers=3, heads=4, kv_groups=2, keep=7)
    scores = edge_scores(d)
    assert scores.tolist() == [e["scores"]["eap"] for e in d["edges"]]
    assert edge_scores(d, "exact").tolist() == [e["scores"]["exact"] for e in d["edges"]]
    circuit = {3, 11}  # not among the strongest
    drawn = _drawn(scores, circuit, 20)
    assert len(drawn) == 22 and circuit <= set(drawn)
    rest = [i for i in range(len(scores)) if i not in circuit]
    strongest = sorted(rest, key=lambda i: -abs(scores[i]))[:20]
    assert set(drawn) - circuit == set(strongest)
    assert [abs(scores[i]) for i in drawn] == sorted(abs(scores[i]) for i in drawn)  # faint first, strong on top
    assert len(_drawn(scores, set(), 10**6)) == len(scores)
    big = set(range(0, len(scores), 2))  # a circuit larger than the cap: its strongest 20 drawn
    drawn = _drawn(scores, big, 20)
    assert set(drawn) & big == set(sorted(big, key=lambda i: -abs(scores[i]))[:20]) and len(drawn) == 40


def test_an_edge_without_the_method_takes_its_first_score():
    d = make_circuit(layers=1, heads=2, kv_groups=1, methods=("eap", "exact"))
    for e in d["edges"][1:]:
        del e["scores"]["exact"]
    s = edge_scores(d, "exact")
    assert s[0] == d["edges"][0]["scores"]["exact"]
    assert s[1:].tolist() == [e["scores"]["eap"] for e in d["edges"][1:]]


def test_the_sign_of_the_scores_sets_the_colour(tmp_path):
    d = make_circuit(layers=2, heads=4, kv_groups=2, keep=12)
    for e in d["edges"]:
        e["scores"] = {k: abs(v) for k, v in e["scores"].items()}
    flipped = copy.deepcopy(d)
    for e in flipped["edges"]:
        e["scores"] = {k: -v for k, v in e["scores"].items()}
    plot_circuit(d, tmp_path / "pos.png", dpi=60, title="")
    plot_circuit(flipped, tmp_path / "neg.png", dpi=60, title="")
    pos, neg = read_png(tmp_path / "pos.png"), read_png(tmp_path / "neg.png")
    # The nodes (orange circuit nodes) are the same in both; only the edges change colour.
    assert _ink(pos, "red") > 500 and _ink(pos, "red") > 5 * _ink(neg, "red")
    assert _ink(neg, "blue") > 500 and _ink(neg, "blue") > 5 * _ink(pos, "blue")


@pytest.mark.slow
def test_fewer_edges_draw_less_ink(tmp_path):
    d = make_circuit(layers=3, heads=4, kv_groups=2, keep=0)
    d["circuit"]["edges"], d["circuit"]["nodes"] = [], []
    ink = {}
    for n in (0, 5, 400):
        plot_circuit(d, tmp_path / f"{n}.png", max_edges=n, dpi=60, title="")
        rgb = read_png(tmp_path / f"{n}.png")[..., :3]
        ink[n] = int((rgb.max(-1) - rgb.min(-1) > 0.08).sum())  # coloured pixels: nodes and edges
    assert ink[400] - ink[0] > 3 * (ink[5] - ink[0]) > 0


def test_a_circuit_object_is_read_through_to_dict(tmp_path):
    d = make_circuit(layers=1, heads=2, kv_groups=None)

    class Circuit:
        def to_dict(self):
            return d

    assert check_circuit(Circuit()) == d
    plot_circuit(Circuit(), tmp_path / "c.svg")
    assert b"<svg" in (tmp_path / "c.svg").read_bytes()[:2000]
    with pytest.raises(TypeError, match="circuit: expected a Circuit"):
        check_circuit([1, 2])


def _broken(change):
    d = make_circuit(layers=1, heads=2, kv_groups=1)
    change(d)
    return d


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda d: d.pop("edges"), "'edges'"),
        (lambda d: d["edges"][0].update(sender="L9.H9"), "sender 'L9.H9'"),
        (lambda d: d["edges"][2].update(input="o"), "input 'o'"),
        (lambda d: d["edges"][1]["scores"].update(eap=float("nan")), "edges[1].scores['eap']"),
        (lambda d: d["nodes"][1].update(kind="attn"), "kind 'attn'"),
        (lambda d: d["nodes"].append(dict(d["nodes"][1])), "appears twice"),
        (lambda d: d["nodes"][1].update(layer=None), "needs a layer"),
        (lambda d: d["circuit"].update(edges=[10**6]), "circuit edge index 1000000"),
        (lambda d: d["circuit"].update(nodes=["L5.MLP"]), "'L5.MLP' is not a node"),
        (lambda d: d["faithfulness"].update(recovered=[0.5]), "6 sizes but 1 recovered"),
        (lambda d: d["node_details"]["L0.H0"].update(pattern=[[1.0], [0.5, 0.5]]), "rows of different lengths"),
        (lambda d: d["node_details"].update({"L7.H0": {}}), "'L7.H0', which is not a node"),
    ],
)
def test_a_malformed_circuit_is_refused_by_name(change, words, tmp_path):
    with pytest.raises(ValueError, match="circuit: ") as err:
        plot_circuit(_broken(change), tmp_path / "c.png")
    assert words in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_bad_options_are_refused(tmp_path):
    d = make_circuit(layers=1, heads=2, kv_groups=1)
    with pytest.raises(ValueError, match="max_edges: expected an integer ≥ 0, got -1"):
        plot_circuit(d, tmp_path / "c.png", max_edges=-1)
    with pytest.raises(ValueError, match="path: expected a file name ending in .png"):
        plot_circuit(d, tmp_path / "c.gif")
