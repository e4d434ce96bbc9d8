"""Does one training step of `symo train` fit in memory? A lower bound, checked before anything is built.

A training step keeps, for the backward pass, about 16 float32 numbers per token, layer and width unit
(the block's input, LayerNorm outputs, q/k/v, the attention output, the MLP's 4x hidden before and after
GELU) and 3 per token and vocabulary entry (logits, their softmax, its gradient); the weights, their
gradients and the optimizer state add a few copies of the parameters. The fused attention kernels keep
no context x context matrix. The measured peaks of one CPU step of the GPT with Symo (batch x context
8x1024, 4x2048, 8x512 and 16x256) were 1.15 to 1.45 times this estimate, so a run it refuses cannot fit:
`--block-size 100000` (54 GB at batch 16) is refused on a 23 GB machine instead of running for a
quarter of an hour.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from .config import TrainConfig

FLOAT_BYTES = 4
ACTIVATIONS_PER_LAYER_WIDTH = 16  # float32 numbers kept per token, layer and width unit
ACTIVATIONS_PER_VOCABULARY = 3    # per token and vocabulary entry: logits, softmax, gradient
PARAMETER_COPIES = 5              # weights, gradients, momentum or Adam's two moments, update


def step_memory(cfg: TrainConfig, vocab_size: int, world: int = 1) -> dict[str, int]:
    """Lower bound in bytes of one training step on one process: {"activations", "parameters", "total"}."""
    tokens = (cfg.batch_size // max(world, 1)) * cfg.block_size
    per_token = ACTIVATIONS_PER_LAYER_WIDTH * cfg.n_layer * cfg.n_embd + ACTIVATIONS_PER_VOCABULARY * vocab_size
    d = cfg.n_embd
    n_params = vocab_size * d + cfg.block_size * d + cfg.n_layer * 12 * d * d
    activations = tokens * per_token * FLOAT_BYTES
    parameters = PARAMETER_COPIES * n_params * FLOAT_BYTES
    return {"activations": activations, "parameters": parameters, "total": activations + parameters}


def available_memory(device: str) -> int | None:
    """Bytes the run can use: the GPU's memory for cuda, else the machine's RAM (or its cgroup limit, when
    lower); None where it cannot be told."""
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_properties(torch.device(device)).total_memory
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows) or no such name
        return None
    try:  # a container's limit (cgroup v2), "max" when none
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        total = min(total, int(limit)) if limit.isdigit() else total
    except OSError:
        pass
    return total


def check_step_fits(cfg: TrainConfig, vocab_size: int, device: str, world: int = 1) -> None:
    """ValueError naming the sizes when one step surely exceeds the memory (processes on one machine share
    its RAM; torchrun's LOCAL_WORLD_SIZE says how many)."""
    need = step_memory(cfg, vocab_size, world)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world)) if torch.device(device).type == "cpu" else 1
    have = available_memory(device)
    if have is None or need["total"] * local <= have:
        return
    where = "this GPU's" if torch.device(device).type == "cuda" else "this machine's"
    processes = f" x {local} processes" if local > 1 else ""
    raise ValueError(
        f"--block-size {cfg.block_size}, --batch-size {cfg.batch_size}, --n-layer {cfg.n_layer}, --n-embd "
        f"{cfg.n_embd} (vocabulary {vocab_size}): one training step needs at least {_gb(need['total'])}{processes} "
        f"(activations kept for the backward pass {_gb(need['activations'])}, weights and optimizer state "
        f"{_gb(need['parameters'])}), more than {where} {_gb(have)} of memory. Memory grows linearly with "
        "--batch-size and --block-size: make them smaller")


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.0f} MB"
