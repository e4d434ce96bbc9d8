"""The options of `symo train` (`TrainConfig`) and their defaults, apart from the training code: the
command line builds its parser from them without importing torch, so `symo --help` is quick."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..optim.presets import PRESETS, get_preset  # plain data: symo.optim loads torch only on first use

OPTIMIZERS = ("symo", "muon", "adamw")
# Learning rates of the covered (hidden-matrix) parameters; tuned on the comparison benchmark
# (benchmarks/results/nanogpt_compare.md). Muon and Symo use Muon's scale (update_scale="muon").
DEFAULT_LR = {"symo": 0.02, "muon": 0.02, "adamw": 4e-3}
# Decoupled weight decay of the hidden matrices (AdamW: of every parameter). The nanoGPT campaign's tuned choice from
# {0, 0.05, 0.1}: 0.05 for Muon at both data-to-model ratios and for SOAP-Muon on gpt_muon_qkv at 2x Chinchilla (at
# 0.26x 0.1, with 0.05 still ahead of 0); for AdamW 0 at 2x (0.05 at 0.26x). On the default 500-step job it changes
# the final loss by about 0.001 (benchmarks/results/nanogpt_matrix.md; docs/training.md)
DEFAULT_WEIGHT_DECAY = {"symo": 0.05, "muon": 0.05, "adamw": 0.0}
# Symo's step when no --preset is given: SOAP-Muon beats tuned Muon outside the paired interval over six seeds
# at both of the nanoGPT campaign's data-to-model ratios (benchmarks/results/soap_seeds.md)
DEFAULT_PRESET = "soap_muon"
# Symo's spec when no --spec is given: the Muon-style spec with c_attn's query, key and value rows as three
# blocks; over six seeds SOAP-Muon on it beats tuned Muon by more than on gpt_muon at both ratios, by about 0.005
# (soap_seeds.md: outside the paired interval against gpt_muon at 0.26x Chinchilla, inside at 2x)
DEFAULT_SPEC = "gpt_muon_qkv"
# Settings a resumed checkpoint must share with the run: they change the model, the optimizer or the
# sequence of batches and learning rates.
RESUME_KEYS = ("data", "vocab", "n_layer", "n_head", "n_embd", "block_size", "bias", "optimizer", "spec", "preset",
               "precondition_frequency", "symo_options", "lr", "adamw_lr", "weight_decay", "warmup", "min_lr_ratio",
               "batch_size", "steps", "seed")
# Symo options that --symo-option refuses: each has its own flag, or is set by how the run is launched
OWN_FLAGS = {"lr": "--lr", "weight_decay": "--weight-decay", "adamw_lr": "--adamw-lr",
             "precondition_frequency": "--precondition-frequency", "ns_method": "--ns-method", "preset": "--preset",
             "distributed_mode": "--fsdp (or torchrun without it, for DDP)"}


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
    spec: str = DEFAULT_SPEC           # Symo's spec: a bundled name (gpt_muon_qkv, gpt_muon, gpt_true, gpt) or a path
    partial: bool = False              # the spec's rules that match no parameter are dropped (strict=False)
    preset: str | None = "auto"        # Symo's preset (symo.PRESETS); auto: DEFAULT_PRESET; None: Symo's defaults
    precondition_frequency: int | None = None  # a preset's factor refresh every N steps; None: the preset's own
    symo_options: dict[str, Any] = field(default_factory=dict)  # Symo options by name, over the preset's
    lr: float | None = None            # hidden matrices; default DEFAULT_LR[optimizer]
    adamw_lr: float = 3e-3             # embeddings, gains, biases (Symo / Muon); AdamW uses lr everywhere
    weight_decay: float | None = None  # hidden matrices (AdamW: all); default DEFAULT_WEIGHT_DECAY[optimizer]
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
        check_values(dataclasses.asdict(self))
        if self.n_embd % self.n_head:
            raise ValueError(f"--n-embd {self.n_embd} must be a multiple of --n-head {self.n_head}")
        if self.symo_options and self.optimizer != "symo":
            raise ValueError(f"--symo-option sets Symo's options; --optimizer {self.optimizer} reads none, leave it "
                             "out")
        if self.preset == "auto":  # None stays: a run saved before the default preset resumes with its own step
            self.preset = DEFAULT_PRESET if self.optimizer == "symo" else None
        if self.preset is not None:
            if self.optimizer != "symo":
                raise ValueError(f"--preset applies to --optimizer symo, not {self.optimizer!r}")
            try:
                preset = get_preset(self.preset)
            except ValueError as err:
                raise ValueError(f"--preset: {err}") from None
            default_lr = preset.lr
            if self.precondition_frequency is not None and "precondition_frequency" not in preset.values:
                raise ValueError(f"--precondition-frequency: --preset {self.preset} keeps no factors to refresh (its "
                                 f"step uses each step's statistic at once); it applies to {REFRESHING}")
        else:
            if self.precondition_frequency is not None:
                raise ValueError("--precondition-frequency applies to --optimizer symo with a --preset that refreshes "
                                 f"its factors ({REFRESHING}); Symo's defaults, Muon and AdamW keep none")
            default_lr = DEFAULT_LR[self.optimizer]
        if self.lr is None:
            self.lr = default_lr
        if self.weight_decay is None:
            self.weight_decay = DEFAULT_WEIGHT_DECAY[self.optimizer]


# torch.manual_seed's range (a larger --seed fails inside torch with "Overflow when unpacking long")
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)
# Far above any useful rate of these optimizers (0.02 for Symo and Muon, 4e-3 for AdamW); a larger one
# overflows float32 in the first update (--lr 1e300 failed inside torch without naming the option).
MAX_LR = 100.0
# Options that only Symo reads, and the one that only Symo and Muon read: given with another optimizer
# they would be silently ignored, so they are refused.
SYMO_ONLY = ("spec", "partial", "preset", "ns_method", "precondition_frequency", "symo_options")
# The presets whose preconditioner refreshes stored factors: --precondition-frequency sets how often
REFRESHING = "--preset " + ", ".join(name for name, p in PRESETS.items() if "precondition_frequency" in p.values)


def spec_reference(spec: str) -> str:
    """How a run records its spec: a spec file as its absolute path, so that `--resume RUN_DIR` from another
    folder reads the same file (an existing file wins over a bundled name, as in `load_spec`); a bundled
    spec's name as it is."""
    return os.path.abspath(spec) if isinstance(spec, str) and os.path.isfile(spec) else spec


def check_values(options: Mapping[str, Any]) -> None:
    """Each option given in `options` ({field name: value}) on its own: ValueError naming the option.

    The command line calls it on the options given before torch is imported, so a bad value is reported
    at once; `TrainConfig` calls it on all of its values, then checks the combinations."""
    def flag(name: str) -> str:
        return "--" + name.replace("_", "-")

    if "optimizer" in options and options["optimizer"] not in OPTIMIZERS:
        raise ValueError(f"--optimizer must be one of {OPTIMIZERS}, got {options['optimizer']!r}")
    for name in ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "steps", "eval_interval", "eval_batches",
                 "threads", "precondition_frequency"):
        if options.get(name) is not None and options[name] < 1:
            raise ValueError(f"{flag(name)} must be >= 1, got {options[name]}")
    for name in ("lr", "adamw_lr"):
        value = options.get(name)
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{flag(name)} must be a positive number, got {value!r}")
        if value is not None and value > MAX_LR:
            raise ValueError(f"{flag(name)} {value:g} is out of range: learning rates of these optimizers are well "
                             f"below 1 (defaults: symo {DEFAULT_LR['symo']:g}, muon {DEFAULT_LR['muon']:g}, adamw "
                             f"{DEFAULT_LR['adamw']:g}); give at most {MAX_LR:g}")
    for name in ("weight_decay", "warmup", "sample_chars"):
        if options.get(name) is not None and options[name] < 0:
            raise ValueError(f"{flag(name)} must be >= 0, got {options[name]}")
    if options.get("min_lr_ratio") is not None and not 0 <= options["min_lr_ratio"] <= 1:
        raise ValueError(f"--min-lr-ratio must be in [0, 1], got {options['min_lr_ratio']}")
    symo_options = options.get("symo_options")
    if symo_options is not None and not isinstance(symo_options, Mapping):
        raise ValueError(f"symo_options must be a dict {{option: value}} (--symo-option KEY=VALUE), got "
                         f"{type(symo_options).__name__}")
    for key in symo_options or {}:
        check_symo_option_key(key)
    seed = options.get("seed")
    if seed is not None and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise ValueError(f"--seed {seed} is out of range: torch seeds are 64-bit integers, from {SEED_RANGE[0]} "
                         f"to {SEED_RANGE[1]}")


def check_given(given: Mapping[str, Any], optimizer: str) -> None:
    """Options given on the command line that `optimizer` would ignore: ValueError naming them."""
    ignored = [name for name in SYMO_ONLY if name in given and optimizer != "symo"]
    if "adamw_lr" in given and optimizer == "adamw":
        ignored.append("adamw_lr")
    if ignored:
        flags = ", ".join("--symo-option" if name == "symo_options" else "--" + name.replace("_", "-")
                          for name in ignored)
        raise ValueError(f"{flags}: not used by --optimizer {optimizer}, leave {'it' if len(ignored) == 1 else 'them'} "
                         "out (--spec, --partial, --preset, --ns-method, --precondition-frequency and --symo-option "
                         "are Symo's options; --adamw-lr is the rate Symo and Muon give embeddings, gains and biases, "
                         "while AdamW's rate for every parameter is --lr)")


def parse_symo_option(text: str) -> tuple[str, Any]:
    """`--symo-option KEY=VALUE` as (key, value). The value is read as data, never run: true / false, none, an
    integer, a number, a comma-separated tuple of these (adamw_betas=0.9,0.95), or else the text itself (a name
    such as backend=eigh). Symo checks the option and its value when the run starts."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not raw.strip():
        raise ValueError(f"--symo-option: expected KEY=VALUE (e.g. --symo-option eigenbasis_power=0.5), got {text!r}")
    check_symo_option_key(key)
    parts = [_option_value(p.strip()) for p in raw.split(",")]
    return key, tuple(parts) if len(parts) > 1 else parts[0]


def check_symo_option_key(key: Any) -> None:
    """A --symo-option key: a Symo option's name (ValueError otherwise, naming the flag to use instead)."""
    if not isinstance(key, str) or not key.isidentifier():
        raise ValueError(f"--symo-option: {key!r} is not an option name (a Symo option such as eigenbasis_power, "
                         "two_sided or beta1)")
    if key in OWN_FLAGS:
        raise ValueError(f"--symo-option {key}: set it with {OWN_FLAGS[key]}, not --symo-option")


def _option_value(raw: str) -> Any:
    named = {"true": True, "false": False, "none": None, "null": None}
    if raw.lower() in named:
        return named[raw.lower()]
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw
