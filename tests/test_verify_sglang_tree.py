"""The plain-Python references verify_gpu holds sglang 0.5.23's speculative tree kernels to
(node/serving/sglang_kernels.py): the EAGLE trees it feeds them, the tree the build kernel
must produce and the greedy verification's answer, on trees small enough to check by hand."""

from __future__ import annotations

import pytest

from sm120_build.node.serving.sglang_kernels import _built_tree, _eagle_tree, _greedy

pytest.importorskip("torch")


def test_a_topk_1_draft_is_a_chain_below_the_verified_prefix() -> None:
    parents, selected = _eagle_tree(topk=1, depth=3, draft=4, seq_lens=[7], seed=1)
    assert parents == [[-1, 0, 1]] and selected == [[0, 1, 2]]
    tree = _built_tree(parents, selected, [7], topk=1, draft=4)
    assert tree["positions"] == [7, 8, 9, 10]
    assert tree["retrive_index"] == [0, 1, 2, 3]
    assert tree["retrive_next_token"] == [1, 2, 3, -1]
    assert tree["retrive_next_sibling"] == [-1, -1, -1, -1]
    # Each draft token sees the 7 verified tokens, itself and its ancestors.
    rows = [tree["tree_mask"][i * 11 : (i + 1) * 11] for i in range(4)]
    assert [row[7:] for row in rows] == [
        [True, False, False, False],
        [True, True, False, False],
        [True, True, True, False],
        [True, True, True, True],
    ]
    assert all(all(row[:7]) for row in rows)


def test_every_selected_token_of_a_branching_tree_has_its_parent_selected() -> None:
    topk, depth, draft = 4, 4, 8
    parents, selected = _eagle_tree(topk, depth, draft, seq_lens=[5, 9], seed=4)
    for parent_list, chosen in zip(parents, selected, strict=True):
        assert len(parent_list) == topk * (depth - 1) + 1 and len(chosen) == draft - 1
        assert chosen == sorted(chosen)
        for token in chosen:
            if token // topk > 0:
                assert parent_list[token // topk] in chosen
    tree = _built_tree(parents, selected, [5, 9], topk, draft)
    # Every draft token is reached from the root exactly once through next_token/next_sibling.
    for b in range(2):
        reached, stack = [], [0]
        while stack:
            node = stack.pop()
            reached.append(node)
            child = tree["retrive_next_token"][b * draft + node]
            while child != -1:
                stack.append(child)
                child = tree["retrive_next_sibling"][b * draft + child]
        assert sorted(reached) == list(range(draft))


def test_greedy_verification_follows_the_matching_branch() -> None:
    parents, selected = _eagle_tree(topk=1, depth=3, draft=4, seq_lens=[7], seed=1)
    tree = _built_tree(parents, selected, [7], topk=1, draft=4)
    # The target agrees with the first two draft tokens, then predicts 9 where the third
    # draft token is 5.
    candidates, target = [0, 3, 4, 5], [3, 4, 9, 0]
    got = _greedy(tree, candidates, target, bs=1, draft=4, spec=4)
    assert got["accept_token_num"] == [2]
    assert got["accept_index"] == [0, 1, 2, -1]
    assert got["predicts"] == [3, 4, 9, 0]
