"""Packing a group into one row: pure index math, checked on a hand-built batch."""

import torch

from trainer.model.packing import pack_groups, row_length


def test_each_prompt_once_then_its_rollouts_each_seeing_only_the_prompt_and_itself():
    # Prompts [1, 5] (left-padded to 3) and [1, 6, 6]; rollouts 0 and 2 continue the first,
    # rollout 1 the second; two completion inputs each.
    prompt_ids = torch.tensor([[0, 1, 5], [1, 6, 6]])
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    prompt_of = torch.tensor([0, 1, 0])
    inputs = torch.tensor([[7, 8], [9, 10], [11, 12]])
    assert row_length(prompt_mask, prompt_of, steps=2) == 6
    rows = pack_groups(prompt_ids, prompt_mask, prompt_of, inputs)
    assert rows.ids_DL.tolist() == [[1, 5, 7, 8, 11, 12], [1, 6, 6, 9, 10, 0]]
    # each rollout's positions continue its prompt's, as if it ran alone after it
    assert rows.positions_DL.tolist() == [[0, 1, 2, 3, 2, 3], [0, 1, 2, 3, 4, 0]]
    assert rows.row_N.tolist() == [0, 1, 0]
    # the prompt's last column predicts the first token, then each input the next
    assert rows.columns_NT.tolist() == [[1, 2, 3], [2, 3, 4], [1, 4, 5]]
    assert rows.allowed_DLL.int().tolist() == [
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],  # rollout 0 sees the prompt and itself
            [1, 1, 1, 1, 0, 0],
            [1, 1, 0, 0, 1, 0],  # rollout 2 sees the prompt and itself, not rollout 0
            [1, 1, 0, 0, 1, 1],
        ],
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 0, 0],
            [1, 1, 1, 1, 1, 0],
            [0, 0, 0, 0, 0, 1],  # filler sees only filler: no empty softmax row
        ],
    ]


def test_a_completion_of_one_token_packs_the_prompts_alone():
    rows = pack_groups(
        torch.tensor([[1, 5]]),
        torch.tensor([[1, 1]]),
        torch.tensor([0, 0]),
        torch.zeros(2, 0, dtype=torch.long),
    )
    assert rows.ids_DL.tolist() == [[1, 5]]
    assert rows.columns_NT.tolist() == [[1], [1]]
