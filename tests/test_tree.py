import pytest
import torch

from ngspec.contracts import DraftTree, table_cost
from ngspec.tree import additive_mask, batch_blocks, block_positions, block_visibility, children, depths, joint_width, packed_sizes, root_to_leaf_paths, visibility

# root -> a(0) -> b(1)
#      -> a(0) -> c(2)
#      -> d(3)
TREE = DraftTree((10, 11, 12, 13), (-1, 0, 0, -1))


def test_depths_children_paths():
    assert depths(TREE) == [1, 2, 2, 1]
    assert children(TREE) == [[1, 4], [2, 3], [], [], []]
    assert root_to_leaf_paths(TREE) == [[0, 1], [0, 2], [3]]


def test_visibility_hand_worked():
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0],  # root
            [1, 1, 0, 0, 0],  # a
            [1, 1, 1, 0, 0],  # b sees root, a, itself
            [1, 1, 0, 1, 0],  # c sees root, a, itself (not its sibling b)
            [1, 0, 0, 0, 1],  # d
        ],
        dtype=torch.bool,
    )
    assert torch.equal(visibility(TREE), expected)


def test_mask_and_positions_with_past():
    mask = additive_mask(block_visibility(TREE, past_len=3)[:, None], torch.float32)
    assert mask.shape == (1, 1, 5, 8)
    assert torch.all(mask[0, 0, :, :3] == 0)  # the cached prefix is visible to every node
    visible = mask[0, 0, :, 3:] == 0
    assert torch.equal(visible, visibility(TREE))
    assert mask[0, 0, 2, 6].item() == torch.finfo(torch.float32).min
    assert block_positions(TREE, 3) == [3, 4, 5, 5, 4]


def test_batch_blocks_pad_every_row_to_the_widest_tree():
    chain = DraftTree.chain([7, 8])
    ids, positions, visible = batch_blocks([5, 6, 9], [TREE, chain, DraftTree()], [3, 10, 1])
    assert ids.tolist() == [[5, 10, 11, 12, 13], [6, 7, 8, 6, 6], [9, 9, 9, 9, 9]]
    # each row's own block as a single row would verify it; padding one past the root
    assert positions[0].tolist() == block_positions(TREE, 3)
    assert positions[1].tolist() == [10, 11, 12, 11, 11] and positions[2].tolist() == [1, 2, 2, 2, 2]
    assert torch.equal(visible[0], visibility(TREE))
    assert torch.equal(visible[1, :3, :3], visibility(chain)) and not visible[1, :3, 3:].any()
    for b, n in ((1, 3), (2, 1)):  # a padding entry sees the root and itself; nothing sees it
        for j in range(n, 5):
            assert visible[b, j].nonzero().flatten().tolist() == [0, j]
            assert visible[b, :, j].nonzero().flatten().tolist() == [j]


def test_from_paths_merges_prefixes():
    tree = DraftTree.from_paths([[10, 11], [10, 12], [13]])
    assert tree == TREE
    assert DraftTree.chain([5, 6, 7]).parents == (-1, 0, 1)


def test_truncated_stays_prefix_closed():
    assert TREE.truncated(2, 5) == DraftTree((10, 11), (-1, 0))
    assert TREE.truncated(10, 1) == DraftTree((10, 13), (-1, -1))
    assert TREE.truncated(10, 10) is TREE


def test_truncated_against_a_node_by_node_oracle():
    """`DraftTree.truncated` (which slices when no kept node can be too deep) against keeping each
    node in order while fewer than ``max_nodes`` are kept, its parent is kept and it is no deeper
    than ``max_depth``, on random trees with gains and every size and depth limit."""
    import random

    rng = random.Random(3)
    for _ in range(200):
        parents = []
        for i in range(rng.randrange(0, 9)):
            parents.append(rng.randrange(-1, i))
        tree = DraftTree(tuple(rng.randrange(5) for _ in parents), tuple(parents), tuple(rng.random() for _ in parents))
        for max_nodes in range(-1, tree.size + 2):
            for max_depth in range(0, tree.size + 2):
                kept, depth = {}, {-1: 0}
                for i, p in enumerate(tree.parents):
                    if len(kept) < max_nodes and p in depth and depth[p] + 1 <= max_depth:
                        depth[i], kept[i] = depth[p] + 1, len(kept)
                want = DraftTree(
                    tuple(tree.tokens[i] for i in kept), tuple(kept.get(tree.parents[i], -1) for i in kept), tuple(tree.gains[i] for i in kept)
                )
                got = tree.truncated(max_nodes, max_depth)
                assert (got, got.gains) == (want, want.gains)


def test_gains_follow_the_kept_nodes_and_stay_out_of_comparisons():
    offered = DraftTree(TREE.tokens, TREE.parents, (0.9, 0.5, 0.4, 0.3))
    assert offered == TREE
    assert offered.truncated(2, 5).gains == (0.9, 0.5)
    assert offered.truncated(10, 1).gains == (0.9, 0.3)
    assert DraftTree.chain([4, 5], [0.5, 0.25]).gains == (0.5, 0.25)
    with pytest.raises(ValueError, match="gains"):
        DraftTree((1, 2), (-1, 0), (0.5,))


def test_joint_width_hand_worked():
    # rows expect 1 + their drafted tokens: width 0 -> 2 / 1.0, 1 -> (1.9 + 1.2) / 1.1 = 2.82,
    # 2 -> (2.7 + 1.2) / 1.5 = 2.6, 3 -> (2.8 + 1.2) / 3.0: width 1 pays best
    a, b = DraftTree.chain([1, 2, 3], [0.9, 0.8, 0.1]), DraftTree.chain([4], [0.2])
    cost = (1.0, 1.1, 1.5, 3.0)
    assert joint_width([a, b], cost) == 1
    assert joint_width([a, b], (1.0, 1.0, 1.0, 1.0)) == 3  # free nodes: keep everything
    assert joint_width([a, b], ()) == 3  # no cost table: nothing is cut
    # beyond the table its last entry applies: width 3 gives 4.0 / 2.0, as much as width 0 (ties:
    # the narrower)
    assert joint_width([a, b], (1.0, 2.0)) == 0
    assert joint_width([a, b], (1.0, 1.5)) == 3
    # a tree without gains is kept whole: the width never drops below it
    assert joint_width([a, DraftTree.chain([4, 5])], cost) == 2
    assert joint_width([], cost) == 0


def test_a_fractional_size_reads_between_two_table_entries():
    cost = (1.0, 1.1, 1.5, 3.0)
    assert table_cost(cost, 1) == 1.1 and table_cost(cost, 7) == 3.0 and table_cost((), 2.5) == 1.0
    assert table_cost(cost, 0.5) == pytest.approx(1.05) and table_cost(cost, 2.5) == pytest.approx(2.25)


def test_packed_sizes_hand_worked():
    # the same rows as above, packed (the table at the mean nodes per row): nodes added best
    # first, 0.9 -> 2.9 / 1.05 = 2.76, 0.8 -> 3.7 / 1.1 = 3.36, 0.2 -> 3.9 / 1.3 = 3.0, 0.1 ->
    # 4.0 / 1.5: the first row keeps two nodes and the second none (one width for both: one each)
    a, b = DraftTree.chain([1, 2, 3], [0.9, 0.8, 0.1]), DraftTree.chain([4], [0.2])
    cost = (1.0, 1.1, 1.5, 3.0)

    def by_mean(sizes):
        return table_cost(cost, sum(sizes) / len(sizes))

    assert packed_sizes([a, b], by_mean) == [2, 0]
    assert packed_sizes([a, b], lambda sizes: 1.0) == [3, 1]  # free nodes: keep everything
    # a tree without gains is kept whole and its nodes count in the cost: 2 / 1.1, 2.9 / 1.3,
    # 3.7 / 1.5 = 2.47, 3.8 / 2.25
    assert packed_sizes([a, DraftTree.chain([4, 5])], by_mean) == [2, 2]


def test_joint_width_equals_brute_force():
    import random

    rng = random.Random(3)
    for _ in range(200):
        trees = []
        for _ in range(rng.randrange(1, 6)):
            gains = sorted((rng.random() for _ in range(rng.randrange(0, 8))), reverse=True)
            trees.append(DraftTree.chain(range(len(gains)), gains))
        cost = [1.0]
        for _ in range(rng.randrange(1, 10)):
            cost.append(cost[-1] + rng.random() * 0.5)
        widest = max(t.size for t in trees)

        def rate(w):
            return sum(1 + sum(t.gains[:w]) for t in trees) / cost[min(w, len(cost) - 1)]

        best = max(range(widest + 1), key=lambda w: (rate(w), -w))
        assert joint_width(trees, cost) == best


def test_invalid_trees_rejected():
    with pytest.raises(ValueError):
        DraftTree((1, 2), (-1, 1))  # a node cannot be its own parent
    with pytest.raises(ValueError):
        DraftTree((1,), (-1, 0))
    with pytest.raises(ValueError):
        DraftTree((-1,), (-1,))  # never pad with ids: -1 is not a token
