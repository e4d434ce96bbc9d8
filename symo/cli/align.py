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

from ..alignment import AlignError, AlignWarning, align, barrier, interpolate
from ..compiler import load_spec
from ..train.checkpoint import FORMAT, save_atomic, save_checkpoint
from ..train.models import GPT, GPTConfig
from ..train.optimizers import head_basis_sizes
from .common import CommandError, _load_factory, _parse_sizes

__all__ = ["align_command", "load_model_file", "merge_command"]


def align_command(args: argparse.Namespace) -> int:
    """`symo align A B [--model m:f] [--spec S] [--method M] [--data D] [-o OUT]`: B aligned to A, the
    per-space report, and with targets in --data the loss barrier before and after aligning."""
    data = _data(args)
    a, b, blob_b = _models(args)
    result = _align(a, b, args, data, restarts=args.restarts, max_sweeps=args.max_sweeps)
    print(result.report())
    _warn_unconverged(result)
    _report_barrier(a, b, result.model, data, args.data)
    out = Path(args.output) if args.output else Path(args.other).with_name(Path(args.other).stem + "_aligned.pt")
    _write(out, result.model.state_dict(), blob_b, {"aligned_to": str(args.reference)})
    print(f"wrote {out}")
    return 0


def merge_command(args: argparse.Namespace) -> int:
    """`symo merge A B --alpha 0.5 [--no-align]`: (1 - alpha) A + alpha B, B aligned to A first."""
    if not args.align:  # the options that only steer the alignment mean nothing without it: say so
        moot = [flag for flag, given in (("--spec", args.spec is not None), ("--size", bool(args.size)),
                                         ("--method activations", args.method == "activations"),
                                         ("--restarts", args.restarts != 0), ("--max-sweeps", args.max_sweeps != 100),
                                         ("--partial", args.partial), ("--input-shape", args.input_shape is not None))
                if given]
        if moot:
            raise CommandError(f"--no-align interpolates B as given, so {', '.join(moot)} would have no effect; "
                               "leave them out, or drop --no-align to align B first", 2)
    data = _data(args) if args.align or args.data is not None else None
    a, b, blob_b = _models(args)
    if args.align:
        result = _align(a, b, args, data, restarts=args.restarts, max_sweeps=args.max_sweeps)
        print(result.report())
        _warn_unconverged(result)
        _report_barrier(a, b, result.model, data, args.data)
        b = result.model
    else:
        _report_barrier(a, b, None, data, args.data)
    merged = interpolate(a, b, args.alpha)
    out = Path(args.output) if args.output else Path(args.other).with_name("merged.pt")
    _write(out, merged.state_dict(), blob_b, {"merged": [str(args.reference), str(args.other)], "alpha": args.alpha,
                                              "aligned": bool(args.align)})
    print(f"wrote {out} ((1 - {args.alpha:g}) A + {args.alpha:g} B{', B aligned to A' if args.align else ''})")
    return 0


def _data(args: argparse.Namespace) -> tuple[list[Any], bool] | None:
    """--data read as (batches, has_targets): batches are input tensors, or (inputs, targets) pairs when the
    file is a dict with "inputs" and "targets". None without --data; --method activations needs it."""
    if args.data is None:
        if args.method == "activations":
            raise CommandError("--method activations needs --data PATH: a .pt file of input batches to match the "
                               "activations on (or use --method weights)", 2)
        return None
    try:
        blob = torch.load(args.data, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CommandError(f"--data {args.data}: cannot read it as a PyTorch file ({type(exc).__name__}: "
                           f"{str(exc)[:200]}) (nothing was written)", 2) from None
    if isinstance(blob, dict) and "inputs" in blob:
        inputs = _batches(blob["inputs"], args.data, "inputs")
        if blob.get("targets") is None:
            return inputs, False
        targets = _batches(blob["targets"], args.data, "targets")
        if len(targets) != len(inputs) or any(len(x) != len(y) for x, y in zip(inputs, targets)):
            raise CommandError(f"--data {args.data}: 'inputs' and 'targets' differ in their batches or batch sizes "
                               "(nothing was written)", 2)
        return list(zip(inputs, targets)), True
    return _batches(blob, args.data, None), False


def _batches(value: Any, path: str, key: str | None) -> list[torch.Tensor]:
    what = f"{path}[{key!r}]" if key else path
    batches = [value] if isinstance(value, torch.Tensor) else value
    if not isinstance(batches, (tuple, list)) or not batches or not all(
            isinstance(t, torch.Tensor) and t.dim() > 0 for t in batches):
        raise CommandError(f"--data {what}: expected a tensor or a non-empty tuple or list of tensors (one per batch); "
                           "give a file saved with torch.save(x), torch.save((x1, x2)) or "
                           "torch.save({'inputs': x, 'targets': y}) (nothing was written)", 2)
    return list(batches)


def _loss(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy for integer targets (class indices; a sequence model's logits (batch, time, classes) against
    targets (batch, time)), MSE otherwise. A model that returns (logits, loss), as symo train's GPT does, or an
    output with .logits (Hugging Face) is read for its logits."""
    x, y = batch
    out = model(x)
    if hasattr(out, "logits"):
        out = out.logits
    elif isinstance(out, (tuple, list)):
        out = out[0]
    if not y.is_floating_point() and not y.is_complex() and y.dtype != torch.bool:
        if out.dim() > 2 and out.dim() == y.dim() + 1:
            out, y = out.reshape(-1, out.shape[-1]), y.reshape(-1)
        return torch.nn.functional.cross_entropy(out, y)
    return torch.nn.functional.mse_loss(out, y.to(out.dtype))


def _report_barrier(a: torch.nn.Module, b: torch.nn.Module, aligned: torch.nn.Module | None,
                    data: tuple[list[Any], bool] | None, path: str | None) -> None:
    """One line: the loss barrier of A to B as given (naive) and of A to B aligned, on --data's batches."""
    if data is None:
        return
    batches, has_targets = data
    if not has_targets:
        print(f"barrier: skipped (--data {path} holds no targets; save a dict {{'inputs': x, 'targets': y}} for "
              "the loss barrier)")
        return
    integer = not batches[0][1].is_floating_point() and batches[0][1].dtype != torch.bool
    name = "cross-entropy" if integer else "MSE"
    try:
        parts = [f"naive {barrier(a, b, _loss, batches).barrier():.4g}"]
        if aligned is not None:
            parts.append(f"aligned {barrier(a, aligned, _loss, batches).barrier():.4g}")
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        raise CommandError(f"--data {path}: the {name} loss of the models on it failed ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0][:200]}) (nothing was written)", 2) from None
    print(f"loss barrier ({name} on --data, 11 points from A to B): {', '.join(parts)}")


def _align(a: torch.nn.Module, b: torch.nn.Module, args: argparse.Namespace, data: tuple[list[Any], bool] | None,
           **options: Any):
    sizes = _parse_sizes(args.size) or None
    if args.spec is not None and isinstance(a, GPT):  # a symo train checkpoint: its heads size the per-head bases
        d_head = a.config.n_embd // a.config.n_head
        sizes = {**(head_basis_sizes(load_spec(args.spec), d_head) or {}), **(sizes or {})} or None
    inputs = None
    if args.input_shape is not None:
        dtype = next((p.dtype for p in a.parameters() if p.is_floating_point()), torch.float32)
        inputs = torch.randn(args.input_shape, generator=torch.Generator().manual_seed(0), dtype=dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", AlignWarning)
        try:
            result = align(a, b, args.spec, method=args.method, data=data[0] if data is not None else None,
                           sizes=sizes, example_inputs=inputs, check=args.check, progress=args.progress,
                           strict=not args.partial, **options)
        except AlignError as exc:
            raise CommandError(f"{exc} (nothing was written)", 2) from None
        except (RuntimeError, ValueError, TypeError) as exc:
            if args.method != "activations":
                raise
            raise CommandError(f"--method activations on --data {args.data} failed ({type(exc).__name__}: "
                               f"{str(exc).splitlines()[0][:300]}) (nothing was written)", 2) from None
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
