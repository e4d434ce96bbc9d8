"""The options of `symo train` (`TrainConfig`) and their defaults, apart from the training code: the
command line builds its parser from them without importing torch, so `symo --help` is quick."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..optim.presets import get_preset  # plain data: symo.optim loads torch only on first use

OPTIMIZERS = ("symo", "muon", "adamw")
# Learning rates of the covered (hidden-matrix) parameters; tuned on the comparison benchmark
# (benchmarks/results/nanogpt_compare.md). Muon and Symo use Muon's scale (update_scale="muon").
DEFAULT_LR = {"symo": 0.02, "muon": 0.02, "adamw": 4e-3}
# Settings a resumed checkpoint must share with the run: they change the model, the optimizer or the
# sequence of batches and learning rates.
RESUME_KEYS = ("data", "vocab", "n_layer", "n_head", "n_embd", "block_size", "bias", "optimizer", "spec", "preset",
               "lr", "adamw_lr", "weight_decay", "warmup", "min_lr_ratio", "batch_size", "steps", "seed")


@dataclass
class TrainConfig:
    """Every `symo train` option (the command-line flags are these names with dashes)."""

    data: str | None = None            # None: bundled Shakespeare; else a UTF-8 text file
    out_dir: str | None = None         # run folder; default runs/<data>-<optimizer>-<time>
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 64
    bias: bool = True
    optimizer: str = "symo"
    spec: str = "gpt_muon"             # Symo's spec: a bundled name (gpt_muon, gpt_true, gpt) or a path
    partial: bool = False              # the spec's rules that match no parameter are dropped (strict=False)
    preset: str | None = None          # Symo's preset (symo.optim.presets: paper, muon, shampoo); None: Muon's scale
    lr: float | None = None            # hidden matrices; default DEFAULT_LR[optimizer]
    adamw_lr: float = 3e-3             # embeddings, gains, biases (Symo / Muon); AdamW uses lr everywhere
    weight_decay: float = 0.0
    warmup: int = 20                   # linear warm-up steps, then cosine to min_lr_ratio * lr
    min_lr_ratio: float = 0.1
    batch_size: int = 16               # global batch (split over processes)
    steps: int = 500
    eval_interval: int = 100
    eval_batches: int = 8
    seed: int = 0
    device: str = "cpu"
    compile: bool = False
    sample_chars: int = 300
    resume: bool = False
    cache_dir: str | None = None       # encoded-corpus cache; default ~/.cache/symo/data
    progress: bool = True
    threads: int | None = None         # torch.set_num_threads (CPU); default: torch's choice
    ns_method: str = "auto"            # Symo's Newton-Schulz evaluation: auto, iterate, spectral (SymoConfig)
    fsdp: bool = False                 # under torchrun: FSDP2 (fully_shard) instead of DDP

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"--optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"--n-embd {self.n_embd} must be a multiple of --n-head {self.n_head}")
        for name in ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "steps", "eval_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        for name in ("lr", "adamw_lr"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"--{name.replace('_', '-')} must be a positive number, got {value!r}")
        for name in ("weight_decay", "warmup", "sample_chars"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"--min-lr-ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.eval_batches < 1 or (self.threads is not None and self.threads < 1):
            name = "eval_batches" if self.eval_batches < 1 else "threads"
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.preset is not None:
            if self.optimizer != "symo":
                raise ValueError(f"--preset applies to --optimizer symo, not {self.optimizer!r}")
            try:
                default_lr = get_preset(self.preset).lr
            except ValueError as err:
                raise ValueError(f"--preset: {err}") from None
        else:
            default_lr = DEFAULT_LR[self.optimizer]
        if self.lr is None:
            self.lr = default_lr
