"""`hydra.sweeper.pack=auto` (sweeper/plan/pack_size.py): K from bench/PACKED.md's CPU
measurements and from a GPU's free memory, on numbers computed by hand."""

from __future__ import annotations

import logging

import pytest
from conftest import compose_conf

from sweeper.plan.pack_size import (
    ModelShape,
    auto_pack,
    cpu_pack,
    gpu_pack,
    member_bytes,
    model_shape,
)
from sweeper.plan.space import parse_space

GIB = 2**30


@pytest.mark.parametrize(
    ("rollouts", "jobs", "k"),
    [
        (256, 100, 1),  # the tiny model's default, 32 x 8: measured 0.71x packed at K=4
        (64, 100, 1),  # one trial already as large as the flat range's start
        (16, 100, 8),  # 4 x 4: measured 1.21x at K=8; 256 // 16 = 16, capped at 8
        (48, 100, 5),  # 256 // 48 = 5: 240 rollouts a packed step
        (40, 100, 6),  # 256 // 40 = 6
        (16, 3, 3),  # no more members than jobs
        (16, 1, 1),
    ],
)
def test_on_a_cpu_only_small_batches_pack_up_to_256_rollouts_in_all(rollouts, jobs, k):
    assert cpu_pack(rollouts, jobs)[0] == k


def test_the_cpu_reason_names_the_batch_and_the_measurement():
    assert cpu_pack(256, 10) == (
        1,
        "CPU, 256 rollouts a step: from 64 a trial fills the CPU alone (packed 256: 0.71x)",
    )
    assert cpu_pack(16, 10) == (
        8,
        "CPU, 16 rollouts a step: packed up to 256 rollouts, at most 8 and 10 jobs",
    )


def test_a_member_is_its_model_at_float32_and_its_decode_chunk_at_float32():
    shape = ModelShape(params=1000, layers=2, hidden=10, vocab=50)
    # 4 bytes x (1000 + 100 tokens x (2 x 2 layers x 10 + 50)) = 4 x (1000 + 9000)
    assert member_bytes(shape, batch_tokens=100) == 40_000


def test_smollm2_135m_is_counted_high_and_a_member_takes_about_3_gib():
    smollm2 = {
        "hidden_size": 576, "num_hidden_layers": 30, "vocab_size": 49152,
        "intermediate_size": 1536, "tie_word_embeddings": True,
    }  # fmt: skip
    shape = model_shape(smollm2)
    # 49152 x 576 + 30 x (4 x 576^2 + 3 x 576 x 1536) = 28,311,552 + 30 x 3,981,312
    assert shape == ModelShape(147_750_912, 30, 576, 49152)
    assert shape.params >= 134_515_008  # its true count: 3 KV heads of 9 make k, v narrower
    # 4 x (147,750,912 + 8192 x (2 x 30 x 576 + 49152)) = 4 x 833,519,616
    assert member_bytes(shape, 8192) == 3_334_078_464


@pytest.mark.parametrize(
    ("free", "base", "member", "jobs", "k"),
    [
        (100 * GIB, 10 * GIB, 20 * GIB, 16, 4),  # 90 / 20 = 4.5
        (1000 * GIB, 0, GIB, 16, 8),  # room for 1000: at most 8
        (1000 * GIB, 0, GIB, 3, 3),  # at most the jobs
        (10 * GIB, 2 * GIB, 20 * GIB, 16, 1),  # not even one member's room: no pack
        (139 * GIB, 590_000_000, 3_334_078_464, 40, 8),  # SmolLM2 on an H200: 44 fit
    ],
)
def test_on_a_gpu_k_is_the_free_memory_over_a_member_capped(free, base, member, jobs, k):
    assert gpu_pack(free, base, member, jobs)[0] == k


def test_the_gpu_reason_shows_the_arithmetic():
    assert gpu_pack(100 * GIB, 10 * GIB, 20 * GIB, 16)[1] == (
        "GPU, 100.0 GiB free, less 10.0 GiB for the base model, over 20.0 GiB a member; "
        "at most 8 and 16 jobs"
    )


@pytest.mark.parametrize(
    ("overrides", "arguments", "jobs", "k", "said"),
    [
        ([], ["lr=1e-3,2e-3"], 4, 1, "pack=auto: 1 (CPU, 256 rollouts a step: from 64"),
        (["batch_size=4", "group_size=4"], ["lr=1e-3,2e-3"], 4, 4, "pack=auto: 4 (CPU, 16 "),
        # the largest swept value counts: 4 x 8 = 32 rollouts, 256 // 32 = 8
        (["batch_size=4"], ["group_size=2,8"], 20, 8, "pack=auto: 8 (CPU, 32 rollouts"),
        (["batch_size=4"], ["group_size=8,16,32"], 20, 1, "pack=auto: 1 (CPU, 128 rollouts"),
    ],
)
def test_auto_reads_the_sweeps_largest_batch_and_says_what_it_chose(
    caplog, overrides, arguments, jobs, k, said
):
    config = compose_conf("model.device=cpu", *overrides)
    with caplog.at_level(logging.INFO, logger="sweeper.plan.pack_size"):
        assert auto_pack(config, parse_space({}, arguments), jobs) == k
    (line,) = [r.getMessage() for r in caplog.records if r.name == "sweeper.plan.pack_size"]
    assert line.startswith(said)
