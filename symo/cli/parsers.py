"""The arguments of every `symo` command, apart from the commands themselves.

Each subcommand's `run` default names the function that carries it out, as ".module:function" in this
package; `main` imports that module only when the command runs. A `precheck` default, where a command
has one, checks the option values first (raising ValueError), so a bad value is reported at once.
Building the parser, which is all `symo --help` and `symo --version` do, loads only the standard library
and `symo train`'s options (symo/train/config.py), not torch, sympy or networkx.
"""

from __future__ import annotations

import argparse
import dataclasses

from ..optim.presets import PRESETS  # plain data: no torch
from ..train.config import (
    DEFAULT_LR,
    DEFAULT_WEIGHT_DECAY,
    OPTIMIZERS,
    TrainConfig,
    check_given,
    check_values,
    parse_symo_option,
)
from .align_args import add_align_parser, add_merge_parser

# the optimizers `symo equivariance` knows by name (equivariance.py builds them)
BUILTIN_RULES = ("sgd", "heavy_ball", "symo", "gd", "adam", "scalar_adam", "rmsprop", "signum", "lion", "adafactor",
                 "muon", "shampoo")


def add_commands(sub: argparse._SubParsersAction) -> None:
    """The subcommands, in the order `symo --help` lists them."""
    _add_train_parser(sub)
    _add_compile_parser(sub)
    _add_params_parser(sub)
    _add_check_parser(sub)
    _add_infer_parser(sub)
    _add_equivariance_parser(sub)
    add_align_parser(sub)
    add_merge_parser(sub)


def _add_train_parser(sub) -> None:
    """`symo train`: every TrainConfig field as a --flag (symo/train/config.py)."""
    t = sub.add_parser("train", help="train a small GPT on Shakespeare (or --data FILE) with Symo, Muon or AdamW",
                       description="Train a nanoGPT-shaped character model. Under torchrun it runs with DDP, "
                                   "or FSDP2 with --fsdp.")
    helps = {
        "data": "UTF-8 text file (default: the bundled Shakespeare plays)",
        "out_dir": "run folder for log.csv, loss.png, ckpt.pt (default runs/<data>-<optimizer>-<time>)",
        "optimizer": f"one of {', '.join(OPTIMIZERS)}",
        "spec": "Symo's spec: bundled name (gpt_muon_qkv, gpt_muon, gpt_true, gpt: heads of 64) or a .toml path; "
                "default gpt_muon_qkv (Muon-style, with c_attn's query, key and value as three blocks)",
        "partial": "drop the spec's rules that match no parameter of the model, instead of an error",
        "preset": "Symo's preset: published (the published step), notebook (the early "
                  "notebooks' averaged S^-1/2, no momentum), muon, shampoo, eigen_adam (one-sided SOAP), soap "
                  "(SOAP, the authors' algorithm), soap_heavyball (heavyball's SOAP), then_orthogonalize (PMuon) "
                  "or soap_muon (the polar factor of SOAP's direction); default soap_muon (--preset muon: Muon's "
                  "step); --lr defaults to the preset's rate",
        "lr": "learning rate of the hidden matrices (AdamW: of all parameters); default "
              + ", ".join(f"{k} {v:g}" for k, v in DEFAULT_LR.items()),
        "adamw_lr": "Symo / Muon: AdamW rate for embeddings, LayerNorm gains and biases",
        "weight_decay": "decoupled weight decay of the hidden matrices (AdamW: of all parameters); default "
                        + ", ".join(f"{k} {v:g}" for k, v in DEFAULT_WEIGHT_DECAY.items()),
        "precondition_frequency": "Symo with a --preset that keeps factors (published, notebook, shampoo, eigen_adam, "
                                  "soap, soap_heavyball, then_orthogonalize, soap_muon): refresh them every N "
                                  "steps",
        "warmup": "linear warm-up steps (then cosine decay to --min-lr-ratio x lr)",
        "batch_size": "global batch (divided among processes)",
        "eval_interval": "steps between validation losses (and checkpoints)",
        "device": "cpu or cuda",
        "compile": "torch.compile the model",
        "resume": "continue the run in RUN_DIR (or --out-dir) from its ckpt.pt, bit-identically; every option not "
                  "given is taken from the checkpoint",
        "cache_dir": "encoded-corpus cache folder (default: platform cache, or $SYMO_DATA_CACHE)",
        "sample_chars": "characters sampled at the end (0: none)",
        "threads": "torch CPU threads per process",
        "fsdp": "under torchrun: shard the model with FSDP2 (fully_shard) instead of replicating it with DDP; "
                "Symo computes each block's matrix function on one rank either way",
        "ns_method": "Symo: Newton-Schulz as the iteration (iterate), through one eigh (spectral), or auto "
                     "(spectral on CPU where cheaper); default %(default)s",
    }
    # Defaults are left out of the namespace (SUPPRESS): `--resume RUN_DIR` takes every option not given
    # from the checkpoint, so the options given must be told apart from the defaults.
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        text = helps.get(f.name, "(default %(default)s)").replace("%(default)s", str(f.default))
        if f.name == "bias":
            t.add_argument("--no-bias", dest="bias", action="store_false", default=argparse.SUPPRESS,
                           help="no biases in Linear / LayerNorm")
        elif f.name == "progress":
            t.add_argument("--no-progress", dest="progress", action="store_false", default=argparse.SUPPRESS,
                           help="no progress bar (the results, the sample and the paths are still printed)")
        elif f.name == "symo_options":
            t.add_argument("--symo-option", dest="symo_options", action=SymoOptionAction, default=argparse.SUPPRESS,
                           metavar="KEY=VALUE",
                           help="Symo: set any option of symo.Symo over the preset's (repeatable), e.g. "
                                "--symo-option eigenbasis_power=0.5 --symo-option two_sided=false; the value is a "
                                "number, true / false, none, a name, or a comma-separated tuple")
        elif f.name == "resume":
            t.add_argument(flag, nargs="?", const=True, default=argparse.SUPPRESS, metavar="RUN_DIR", help=text)
        elif f.type in ("bool", bool):
            t.add_argument(flag, action="store_true", default=argparse.SUPPRESS, help=text)
        else:
            kind = {"int": int, "float": float}.get(str(f.type).removesuffix(" | None"), str)
            t.add_argument(flag, type=kind, default=argparse.SUPPRESS, help=text,
                           choices={"optimizer": OPTIMIZERS, "ns_method": ("auto", "iterate", "spectral"),
                                    "preset": tuple(PRESETS)}.get(f.name))
    t.set_defaults(run=".train:train_command", precheck=check_train_options)


class SymoOptionAction(argparse.Action):
    """`--symo-option KEY=VALUE`, repeatable: collected into one {key: value} dict; a key given twice is refused."""

    def __call__(self, parser, namespace, text, option_string=None) -> None:
        try:
            key, value = parse_symo_option(text)
        except ValueError as err:
            message = str(err).removeprefix("--symo-option: ").removeprefix("--symo-option ")
            raise argparse.ArgumentError(self, message) from None
        options = dict(getattr(namespace, self.dest, None) or {})
        if key in options:
            raise argparse.ArgumentError(self, f"{key} is given twice ({options[key]!r} and {value!r}); give it once")
        setattr(namespace, self.dest, {**options, key: value})


def check_train_options(args: argparse.Namespace) -> None:
    """`symo train`'s option values, checked before torch is imported (ValueError naming the option): each
    value given, and unless resuming (the checkpoint supplies the rest) their combinations and the options
    the optimizer would ignore. train_command checks the same again once the options are complete."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig) if hasattr(args, f.name)}
    check_values(given)
    if not given.get("resume"):
        check_given(given, given.get("optimizer", TrainConfig.optimizer))
        TrainConfig(**given)
    elif "optimizer" in given:
        check_given(given, given["optimizer"])



def _add_compile_parser(sub) -> None:
    c = sub.add_parser("compile", help="compile a spec and print its structure")
    c.add_argument("spec", help="path to a .toml spec file, or the name of a bundled spec (e.g. gpt_muon)")
    src = c.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="module:factory returning an nn.Module, e.g. symo.train.models:gpt_small")
    src.add_argument("--shapes", help="name=16x8,other=16 or a JSON file {name: shape}")
    c.add_argument("--size", action="append", default=[], help="space size the shapes leave open, e.g. head{i}=4")
    c.add_argument("--no-disk-cache", action="store_true", help="compile in memory only")
    c.add_argument("--source", action="store_true", help="also print the generated code")
    c.add_argument("--optimizer", action="store_true",
                   help="also report the Symo optimizer it builds (default options; needs --model)")
    c.add_argument("--partial", action="store_true",
                   help="the parameters are a subset of those the spec was written for: drop the rules that match "
                        "none (default: such a rule is an error)")
    c.add_argument("--no-check", dest="check", action="store_false",
                   help="with --model: skip the symmetry check (by default each space is checked as `symo check` "
                        "does, and every space that is not a true symmetry is named in a warning)")
    c.set_defaults(run=".spec:compile_command")



def _add_params_parser(sub) -> None:
    p = sub.add_parser("params", help="list a model's parameter names and shapes (what a spec's [params] matches)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="module:factory returning an nn.Module, e.g. symo.train.models:gpt_small")
    src.add_argument("--shapes", help="name=16x8,other=16 or a JSON file {name: shape}")
    p.set_defaults(run=".spec:params_command")



def _add_check_parser(sub) -> None:
    c = sub.add_parser("check", help="report each space of a spec as a true or relaxed symmetry of a model")
    c.add_argument("spec", help="path to a .toml spec file, or the name of a bundled spec")
    c.add_argument("--model", required=True, help="module:factory returning an nn.Module")
    c.add_argument("--size", action="append", default=[], help="space size the shapes leave open, e.g. head{i}=4")
    c.add_argument("--trials", type=int, default=2, help="random group elements per space (default 2)")
    c.add_argument("--tolerance", type=float, default=1e-9, help="relative output change counted as zero (float64)")
    c.add_argument("--partial", action="store_true", help="drop the spec's rules that match no parameter")
    c.set_defaults(run=".spec:check_command")



def _add_infer_parser(sub) -> None:
    c = sub.add_parser("infer", help="infer a model's symmetry spec, verify it, and print the compile report")
    c.add_argument("--model", required=True, help="module:factory returning an nn.Module")
    c.add_argument("--heads", type=int, default=None, help="head count where the graph does not show the split")
    c.add_argument("--relax", choices=["muon", "muon_pieces"], default=None,
                   help="the Muon-style relaxation instead (muon_pieces: each piece of a fused matrix, such as "
                        "c_attn's query, key and value, a matrix of its own)")
    c.add_argument("-o", "--output", default=None, help="write the spec here (default: print it)")
    c.add_argument("--no-verify", action="store_true", help="skip the numeric check (not recommended)")
    c.add_argument("--each", action="store_true", help="measure each family of spaces, not only all at once")
    c.set_defaults(run=".spec:infer_command")



def _add_equivariance_parser(sub) -> None:
    e = sub.add_parser("equivariance", help="does an optimizer commute with a symmetry? (twin training, float64)",
                       description="Train w and A w in lockstep (A a random element of the spec's group) and "
                                   "report ||A w_t - w'_t|| / ||w'_t|| at step 1 and after --steps steps. Exit "
                                   "status 0 if equivariant, 1 if not. Default problem: a small W = U V^T "
                                   "matrix-sensing problem with the O(k) gauge (specs/factored.toml).")
    e.add_argument("optimizer", nargs="+",
                   help=f"one or more of {', '.join(BUILTIN_RULES)}, or module:factory (factory(named_params) "
                        "returns a torch.optim.Optimizer)")
    e.add_argument("--lr", type=float, default=None, help="learning rate of the built-in rules (default per rule)")
    e.add_argument("--steps", type=int, default=10, help="lockstep steps, >= 1 (default 10)")
    e.add_argument("--seed", type=int, default=0, help="seed of the group element and the problem (default 0)")
    e.add_argument("--tolerance", type=float, default=1e-8,
                   help="relative divergence below which a rule is equivariant, >= 0 (default 1e-8)")
    e.add_argument("--spec", default=None, help="symmetry spec of --model, also the spec of the built-in 'symo' "
                                                "rule (default: factored, with the default problem)")
    e.add_argument("--model", default=None, help="module:factory returning an nn.Module (needs --loss and --spec)")
    e.add_argument("--loss", default=None, help="module:function, loss(module) -> scalar tensor")
    e.set_defaults(run=".equivariance:equivariance_command")
