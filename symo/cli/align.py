"""`symo align A.pt B.pt` and `symo merge A.pt B.pt --alpha 0.5` (their arguments: align_args.py).

Both read what `symo train` saves (ckpt.pt: the GPT is rebuilt from the checkpoint's options) or a plain
state_dict with `--model module:factory`, and write the result atomically: a state_dict, or, when B is
a symo train checkpoint, a checkpoint in its format holding the new model and B's options (no optimizer
state: the moved model's optimizer state would not match it). Nothing is written on an error.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

from ..alignment import AlignError, AlignWarning, align, interpolate
from ..train.checkpoint import FORMAT, save_atomic, save_checkpoint
from ..train.models import GPT, GPTConfig
from .common import CommandError, _load_factory, _parse_sizes

__all__ = ["align_command", "load_model_file", "merge_command"]


def align_command(args: argparse.Namespace) -> int:
    """`symo align A B [--model m:f] [--spec S] [-o OUT]`: B aligned to A, and the per-space report."""
    a, b, blob_b = _models(args)
    result = _align(a, b, args, restarts=args.restarts, max_sweeps=args.max_sweeps)
    print(result.report())
    _warn_unconverged(result)
    out = Path(args.output) if args.output else Path(args.other).with_name(Path(args.other).stem + "_aligned.pt")
    _write(out, result.model.state_dict(), blob_b, {"aligned_to": str(args.reference)})
    print(f"wrote {out}")
    return 0


def merge_command(args: argparse.Namespace) -> int:
    """`symo merge A B --alpha 0.5 [--no-align]`: (1 - alpha) A + alpha B, B aligned to A first."""
    a, b, blob_b = _models(args)
    if args.align:
        result = _align(a, b, args, restarts=args.restarts, max_sweeps=args.max_sweeps)
        print(result.report())
        _warn_unconverged(result)
        b = result.model
    merged = interpolate(a, b, args.alpha)
    out = Path(args.output) if args.output else Path(args.other).with_name("merged.pt")
    _write(out, merged.state_dict(), blob_b, {"merged": [str(args.reference), str(args.other)], "alpha": args.alpha,
                                              "aligned": bool(args.align)})
    print(f"wrote {out} ((1 - {args.alpha:g}) A + {args.alpha:g} B{', B aligned to A' if args.align else ''})")
    return 0


def _align(a: torch.nn.Module, b: torch.nn.Module, args: argparse.Namespace, **options: Any):
    sizes = _parse_sizes(args.size) or None
    inputs = None
    if args.input_shape is not None:
        dtype = next((p.dtype for p in a.parameters() if p.is_floating_point()), torch.float32)
        inputs = torch.randn(args.input_shape, generator=torch.Generator().manual_seed(0), dtype=dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", AlignWarning)
        try:
            result = align(a, b, args.spec, sizes=sizes, example_inputs=inputs, check=args.check,
                           progress=args.progress, strict=not args.partial, **options)
        except AlignError as exc:
            raise CommandError(f"{exc} (nothing was written)", 2) from None
    for w in caught:
        if issubclass(w.category, AlignWarning):
            sys.stdout.flush()
            print(f"warning: {w.message}", file=sys.stderr)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return result


def _warn_unconverged(result: Any) -> None:
    """A warning on stderr when the coordinate descent stopped at its sweep limit (the report says it too)."""
    if not result.converged:
        sys.stdout.flush()
        print(f"warning: the alignment stopped at the sweep limit (--max-sweeps {result.sweeps}) before converging, "
              f"so a better element may exist: rerun with a larger one, e.g. --max-sweeps {4 * result.sweeps}",
              file=sys.stderr)


def _models(args: argparse.Namespace) -> tuple[torch.nn.Module, torch.nn.Module, dict | None]:
    """Both models built and loaded; the B checkpoint's blob when it is a symo train checkpoint."""
    state_a, blob_a = load_model_file(args.reference)
    state_b, blob_b = load_model_file(args.other)
    if state_a.keys() != state_b.keys():  # before any architecture is built: one --model could not fit both
        raise CommandError(f"{args.reference} and {args.other} are different models: "
                           f"{_key_difference(state_a, state_b, (args.reference, args.other))}. Give two models of the "
                           "same architecture (nothing was written)", 2)
    models = []
    for path, state, blob in ((args.reference, state_a, blob_a), (args.other, state_b, blob_b)):
        if args.model:
            model = _load_factory(args.model)
        elif blob is not None:
            model = _train_model(path, blob)
        else:
            raise CommandError(f"{path} is a plain state_dict: give --model module:factory to build its architecture",
                               2)
        try:
            model.load_state_dict(state)
        except RuntimeError as exc:
            label = f"--model {args.model}" if args.model else "the GPT of its options"
            expected = model.state_dict()
            reason = (_key_difference(state, expected, ("the file", "the model")) if state.keys() != expected.keys()
                      else str(exc).splitlines()[-1].strip()[:400])
            raise CommandError(f"{path} does not fit {label}: {reason} (nothing was written)", 2) from None
        models.append(model)
    return models[0], models[1], blob_b


def load_model_file(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict | None]:
    """(state_dict, the symo train checkpoint or None) from a file; CommandError for anything else."""
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CommandError(f"{path}: cannot read it as a PyTorch file ({type(exc).__name__}: {str(exc)[:200]}); give a "
                           "symo train checkpoint (ckpt.pt) or a file saved with torch.save(model.state_dict())",
                           2) from None
    if isinstance(blob, dict) and blob.get("format") == FORMAT and _is_state(blob.get("model")):
        return blob["model"], blob
    if _is_state(blob):
        return blob, None
    for key in ("model", "state_dict"):
        if isinstance(blob, dict) and _is_state(blob.get(key)):
            return blob[key], None
    what = f"a dict with keys {sorted(map(str, blob))[:6]}" if isinstance(blob, dict) else type(blob).__name__
    raise CommandError(f"{path}: not a model checkpoint ({what}); give a symo train checkpoint (ckpt.pt) or a file "
                       "saved with torch.save(model.state_dict()) (nothing was written)", 2)


def _key_difference(first: dict[str, Any], second: dict[str, Any], labels: tuple[str, str], shown: int = 3) -> str:
    """`only A has 'x', 'y', 'z' and 4 more; only B has 'w'`: whole entry names, the first few on each side."""
    parts = []
    for (this, other), label in zip(((first, second), (second, first)), labels):
        names = [k for k in this if k not in other]
        if names:
            more = f" and {len(names) - shown} more" if len(names) > shown else ""
            parts.append(f"only {label} has {', '.join(repr(n) for n in names[:shown])}{more}")
    return "; ".join(parts)


def _is_state(x: Any) -> bool:
    return isinstance(x, dict) and bool(x) and all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                    for k, v in x.items())


def _train_model(path: str, blob: dict) -> GPT:
    """The GPT a symo train checkpoint holds, from its recorded options and vocabulary."""
    options, settings = blob.get("options") or {}, blob.get("settings") or {}
    try:
        cfg = GPTConfig(block_size=options["block_size"], vocab_size=len(settings["vocab"]),
                        n_layer=options["n_layer"], n_head=options["n_head"], n_embd=options["n_embd"],
                        bias=options["bias"])
    except (KeyError, TypeError):
        raise CommandError(f"{path}: the checkpoint does not record its model's options; give --model module:factory",
                           2) from None
    return GPT(cfg)


def _write(path: Path, state: dict[str, torch.Tensor], blob_b: dict | None, extra: dict[str, Any]) -> None:
    """Atomically (a temporary file in the same folder, fsynced, renamed over `path`)."""
    if blob_b is None:
        save_atomic(path, state)
    else:
        save_checkpoint(path, {"model": state, "settings": blob_b.get("settings", {}),
                               "options": blob_b.get("options", {}), **extra})
