"""Draft topologies (algorithms.md section 4): parsing, refusals, and the breadth-first layout."""

import pytest
import torch

from specdemo.errors import SpecdemoError
from specdemo.trees import MAX_DEPTH, MAX_NODES, Topology


@pytest.mark.parametrize(
    "text,widths",
    [
        ("3,2,1", (3, 2, 1)),
        ("4x4", (4, 4, 4, 4)),
        ("1x5", (1, 1, 1, 1, 1)),
        ("chain:5", (1, 1, 1, 1, 1)),
        (" 2, 3 ", (2, 3)),
        ("2X3", (2, 2, 2)),
        ("7", (7,)),
    ],
)
def test_parse(text, widths):
    t = Topology.parse(text)
    assert t.widths == widths
    assert t.depth == len(widths)
    assert Topology.parse(str(t)) == t  # str is a spelling parse accepts


def test_chain_and_uniform_constructors():
    assert Topology.parse("chain:5") == Topology.chain(5) == Topology.parse("1x5")
    assert Topology.chain(5).is_chain and not Topology.parse("2,1").is_chain
    assert Topology.parse("4x4") == Topology.uniform(4, 4)


@pytest.mark.parametrize(
    "text,words",
    [
        ("", ["cannot read", "accepted"]),
        ("   ", ["cannot read"]),
        ("3,0,1", ["positive"]),
        ("0x4", ["positive"]),
        ("abc", ["abc"]),
        ("2x", ["2x"]),
        ("3,,1", ["3,,1"]),
        ("3;2", ["3;2"]),
        ("-1,2", ["-1,2"]),
        ("1.5,2", ["1.5,2"]),
        ("chain:five", ["chain:five"]),
        ("4x7", ["4x7", str(MAX_NODES)]),  # 4 + 16 + ... + 16384 drafted nodes
        ("64,64,64", [str(MAX_NODES)]),
        (f"chain:{MAX_DEPTH + 1}", ["depth", str(MAX_DEPTH)]),
    ],
)
def test_refusals_name_the_problem(text, words):
    with pytest.raises(SpecdemoError) as err:
        Topology.parse(text)
    message = str(err.value)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_limits_are_inclusive():
    assert Topology.parse(f"chain:{MAX_DEPTH}").depth == MAX_DEPTH
    # 4 + 16 + 64 + 256 + 1024 = 1364 drafted nodes: allowed
    assert Topology.parse("4x5").num_drafted == 1364


@pytest.mark.parametrize("text", ["4x0", "chain:0", "0"])
def test_a_tree_of_depth_zero_is_refused(text):
    """A topology string that drafts nothing is not a tree; accepting it silently turns a chain or tree
    run into plain sampling."""
    with pytest.raises(SpecdemoError):
        Topology.parse(text)


TOPOLOGIES = ["3,2,1", "4x4", "1x5", "2,3,4", "1,3,1,2", "5"]


@pytest.mark.parametrize("text", TOPOLOGIES)
def test_breadth_first_layout(text):
    t = Topology.parse(text)
    parent, depth, first = t.parent.tolist(), t.node_depth.tolist(), t.first_child.tolist()
    sizes = [1]
    for w in t.widths:
        sizes.append(sizes[-1] * w)
    assert t.num_nodes == sum(sizes) == len(parent) == len(depth) == len(first)
    assert t.num_drafted == sum(sizes[1:])  # B = w1 + w1 w2 + ...
    assert t.level_sizes == tuple(sizes)
    assert parent[0] == -1 and depth[0] == 0
    assert depth == sorted(depth)  # level by level
    for i in range(1, t.num_nodes):
        assert parent[i] < i
        assert depth[i] == depth[parent[i]] + 1
    for i in range(t.num_nodes):
        kids = [j for j in range(t.num_nodes) if parent[j] == i]
        if depth[i] < t.depth:
            w = t.widths[depth[i]]
            assert kids == list(range(first[i], first[i] + w))  # contiguous, first_child first
        else:
            assert kids == [] and first[i] == t.num_nodes
    # siblings of consecutive parents are consecutive: the whole level is ordered by parent
    for d in range(1, t.depth + 1):
        lo, hi = t.level_starts[d], t.level_starts[d + 1]
        assert parent[lo:hi] == sorted(parent[lo:hi])


@pytest.mark.parametrize("text", TOPOLOGIES)
def test_truncation_is_a_prefix(text):
    t = Topology.parse(text)
    for depth in range(t.depth + 1):
        short = Topology(t.widths[:depth])
        m = t.nodes_to_depth(depth)
        assert m == short.num_nodes
        assert torch.equal(t.parent[:m], short.parent)
        assert torch.equal(t.node_depth[:m], short.node_depth)
        assert bool((t.node_depth[:m] <= depth).all()) and (m == t.num_nodes or int(t.node_depth[m]) == depth + 1)


@pytest.mark.parametrize(
    "widths,leaves,rows",
    [
        ((1, 1, 1), False, 3),
        ((1,) * 5, False, 5),
        ((1,) * 7, False, 7),
        ((2, 2, 2), False, 7),
        ((2,) * 5, False, 31),
        ((4, 4, 4), False, 21),
        ((4,) * 4, False, 85),
        ((4, 4, 4), True, 85),
        ((4,) * 4, True, 341),
        ((4,) * 5, True, 1365),
    ],
)
def test_rows_per_round_matches_algorithms_md_table(widths, leaves, rows):
    """Internal nodes (the root included), plus the leaves when they are evaluated."""
    assert Topology(widths).rows_per_round(leaves) == rows


def test_rows_per_round_counts_internal_nodes():
    t = Topology.parse("3,2,1")
    internal = sum(1 for i in range(t.num_nodes) if int(t.node_depth[i]) < t.depth)
    assert t.rows_per_round() == internal == 1 + 3 + 6
    assert t.rows_per_round(evaluate_leaves=True) == t.num_nodes == 16


def test_plain_sampling_topology():
    t = Topology(())
    assert t.depth == 0 and t.num_drafted == 0 and t.num_nodes == 1
