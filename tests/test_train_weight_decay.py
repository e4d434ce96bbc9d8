"""`symo train`'s weight decay: its default per optimizer (the campaign's tuned choice), that the optimizer it builds
uses it, and that a run started before the default changed resumes with the decay it was started with."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cases import tiny

import symo.cli
from symo.train import DEFAULT_WEIGHT_DECAY, TrainConfig, build_optimizer
from symo.train.models import GPT, GPTConfig


@pytest.mark.parametrize("optimizer, decay", [("symo", 0.05), ("muon", 0.05), ("adamw", 0.0)])
def test_the_default_decay_is_the_optimizers_and_reaches_its_hidden_matrices(optimizer: str, decay: float) -> None:
    cfg = TrainConfig(optimizer=optimizer)
    assert cfg.weight_decay == DEFAULT_WEIGHT_DECAY[optimizer] == decay
    assert TrainConfig(optimizer=optimizer, weight_decay=0.0).weight_decay == 0.0  # given: kept, 0 included
    model = GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8))
    groups = build_optimizer(model, cfg).param_groups
    hidden = [g for g in groups if any(p is model.transformer.h[0].mlp.c_fc.weight for p in g["params"])]
    assert len(hidden) == 1 and hidden[0]["weight_decay"] == decay


def _argv(cfg: TrainConfig, *extra: str) -> list[str]:
    return ["train", "--data", cfg.data, "--cache-dir", cfg.cache_dir, "--out-dir", cfg.out_dir, "--n-layer", "1",
            "--n-head", "2", "--n-embd", "16", "--block-size", "16", "--batch-size", "4", "--steps", "3",
            "--warmup", "2", "--eval-interval", "2", "--eval-batches", "1", "--sample-chars", "0", "--threads", "1",
            "--no-progress", *extra]


@pytest.mark.parametrize("started_with", [[], ["--weight-decay", "0"]])
def test_a_resumed_run_keeps_the_decay_it_was_started_with(tmp_path: Path, started_with: list[str]) -> None:
    """A run started without --weight-decay records the default it ran with; one started with 0 (every run before
    the default was 0.05) resumes at 0 when the flag is not given again."""
    cfg = tiny(tmp_path)
    assert symo.cli.main(_argv(cfg, *started_with)) == 0
    run = Path(cfg.out_dir)
    recorded = torch.load(run / "ckpt.pt", weights_only=True)["options"]["weight_decay"]
    assert recorded == (0.0 if started_with else 0.05)
    assert symo.cli.main(["train", "--resume", str(run), "--steps", "5"]) == 0
    blob = torch.load(run / "ckpt.pt", weights_only=True)
    assert blob["step"] == 5 and blob["options"]["weight_decay"] == recorded
