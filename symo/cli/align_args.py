"""The arguments of `symo align` and `symo merge` (standard library only: `symo --help` loads this module).

Paths are checked while the arguments are read, so a missing input or an output that would overwrite an
input is refused at once, before torch is imported."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

_INPUTS = ("reference", "other")


class _PathArg(argparse.Action):
    """An input checkpoint (must be a file) or the output (must not be one of the inputs)."""

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        if self.dest in _INPUTS and not Path(value).is_file():
            parser.error(f"{value}: no such file (give a checkpoint written by symo train, or a state_dict saved "
                         "with torch.save)")
        setattr(namespace, self.dest, value)
        paths = [getattr(namespace, d, None) for d in (*_INPUTS, "output")]
        out = paths[-1]
        if out is not None and any(p is not None and _same(out, p) for p in paths[:-1]):
            parser.error(f"-o {out} is one of the inputs; write the result to another file (nothing was written)")


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b) if Path(a).exists() else Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def _alpha(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number (0 gives A, 1 gives B), got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        dims = ()
    if not dims or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"expected dimensions joined by x, e.g. 2x1x28x28, got {text!r}")
    return dims


def _data_file(text: str) -> str:
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"{text}: no such file (give a .pt file saved with torch.save: an input "
                                         "tensor, a tuple of input batches, or a dict with 'inputs' and 'targets')")
    return text


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("reference", action=_PathArg, help="model A: a symo train checkpoint (ckpt.pt) or a state_dict file")
    p.add_argument("other", action=_PathArg, help="model B, of the same architecture")
    p.add_argument("--model", default=None,
                   help="module:factory building the architecture (not needed for symo train checkpoints: the GPT "
                        "is rebuilt from the checkpoint's options)")
    p.add_argument("--spec", default=None,
                   help="spec: a .toml path or a bundled name (default: inferred from the model and verified, "
                        "as symo infer does)")
    p.add_argument("--size", action="append", default=[], help="space size the shapes leave open, e.g. head{i}=4")
    p.add_argument("--partial", action="store_true",
                   help="drop the spec's rules that match no parameter of the model, instead of an error")
    p.add_argument("--input-shape", type=_shape, default=None, metavar="DIMS",
                   help="the model's input, one random float batch of this shape (e.g. 2x1x28x28), for inferring and "
                        "checking the spec (default: model.example_inputs() if it has one, else guessed as symo infer "
                        "does)")
    p.add_argument("--method", choices=("weights", "activations"), default="weights",
                   help="weights: match the weights (default, no data needed); activations: match the hidden units' "
                        "activations on the batches of --data (which it requires)")
    p.add_argument("--data", type=_data_file, default=None, metavar="PATH",
                   help="a .pt file (torch.save) of input batches: a tensor (one batch), a tuple or list of tensors "
                        "(the batches), or a dict {'inputs': ..., 'targets': ...} of matching tensors or lists. Used "
                        "by --method activations, and for a loss barrier report (naive vs aligned, 11 points) when "
                        "it holds targets: cross-entropy for integer targets, MSE otherwise; without targets the "
                        "barrier is skipped with a note")
    p.add_argument("-o", "--output", action=_PathArg, default=None, help="where to write the result")
    p.add_argument("--no-check", dest="check", action="store_false",
                   help="skip the symmetry check (by default a space that is not a true symmetry is named in a "
                        "warning: the result then computes another function there)")
    p.add_argument("--restarts", type=int, default=0, help="random restarts of the coordinate descent (default 0)")
    p.add_argument("--max-sweeps", type=int, default=100,
                   help="sweeps over the spaces at most (default 100; a warning says when they run out)")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar (none is shown either where stderr is not a terminal)")


def add_align_parser(sub: argparse._SubParsersAction) -> None:
    a = sub.add_parser("align", help="move model B by the symmetry group element that matches it best to model A",
                       description="Matching modulo the spec's group (by weights, or --method activations by "
                                   "activations on --data): permutations, signed permutations and "
                                   "O(k) rotations (per head too), found by coordinate descent; B moved by the element "
                                   "found computes B's function wherever the spec is a true symmetry. Writes B "
                                   "aligned (default: B_aligned.pt next to B) and prints the per-space report.")
    _common(a)
    a.set_defaults(run=".align:align_command")


def add_merge_parser(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser("merge", help="interpolate two models, (1 - alpha) A + alpha B, after aligning B to A",
                       description="Writes (1 - alpha) A + alpha B (default: merged.pt next to B). B is first aligned "
                                   "to A modulo the spec's group (as symo align does) unless --no-align is given. "
                                   "BatchNorm statistics and REPAIR need data: use symo.repair in Python.")
    _common(m)
    m.add_argument("--alpha", type=_alpha, default=0.5, help="weight of B (default 0.5)")
    m.add_argument("--no-align", dest="align", action="store_false", help="interpolate as given, without aligning")
    m.set_defaults(run=".align:merge_command")
