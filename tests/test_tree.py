import pytest
import torch

from ngspec.contracts import DraftTree
from ngspec.tree import attention_mask, children, depths, position_ids, root_to_leaf_paths, visibility

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
    mask = attention_mask(TREE, past_len=3, dtype=torch.float32)
    assert mask.shape == (1, 1, 5, 8)
    assert torch.all(mask[0, 0, :, :3] == 0)  # the cached prefix is visible to every node
    visible = mask[0, 0, :, 3:] == 0
    assert torch.equal(visible, visibility(TREE))
    assert mask[0, 0, 2, 6].item() == torch.finfo(torch.float32).min
    assert position_ids(TREE, 3).tolist() == [[3, 4, 5, 5, 4]]


def test_from_paths_merges_prefixes():
    tree = DraftTree.from_paths([[10, 11], [10, 12], [13]])
    assert tree == TREE
    assert DraftTree.chain([5, 6, 7]).parents == (-1, 0, 1)


def test_truncated_stays_prefix_closed():
    assert TREE.truncated(2, 5) == DraftTree((10, 11), (-1, 0))
    assert TREE.truncated(10, 1) == DraftTree((10, 13), (-1, -1))
    assert TREE.truncated(10, 10) is TREE


def test_invalid_trees_rejected():
    with pytest.raises(ValueError):
        DraftTree((1, 2), (-1, 1))  # a node cannot be its own parent
    with pytest.raises(ValueError):
        DraftTree((1,), (-1, 0))
    with pytest.raises(ValueError):
        DraftTree((-1,), (-1,))  # never pad with ids: -1 is not a token
