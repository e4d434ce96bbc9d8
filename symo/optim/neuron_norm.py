"""NorMuon's neuron-wise normalization (Li et al. 2025, "NorMuon: making Muon more efficient and scalable") of a
polar-factor kind's update, per covered matrix:

    Z = the kind's update, as rows x (the rest flattened)      (a row: one output unit's weights)
    v <- beta2 v + (1 - beta2) mean_j Z_ij^2                  (per row, kept in the parameter's state)
    Z <- Z / (sqrt(v) + 1e-10), then rescaled to ||Z||_F before

A polar factor gives every direction the same size, but not every neuron: a row's share of the update follows the
gradient's. Dividing each row by a running root of its mean square evens the neurons out; rescaling keeps the
kind's step size, Muon's per-shape factor sqrt(max(1, rows / cols)) included, so the learning rate keeps its
meaning (`update_scale="muon"`: Muon's rates). With Symo's `preset="muon"` on a Muon-style spec this is
pytorch-optimizer's `NorMuon` at its defaults (`preserve_norm`, tests/test_neuron_norm.py).

The statistic is per row, so a spec that permutes or sign-flips a matrix's rows (every Muon-style spec) moves it
with them: the step stays equivariant. A rotation of the rows mixes them, so `check_rows` refuses a spec whose
orthogonal space acts on a covered matrix's rows (a true-symmetry spec's attention heads). Parameters of one
dimension keep the kind's update.
"""

from __future__ import annotations

import torch

from ..runtime.compiled import CompiledSpec

EPS = 1e-10  # NorMuon's, under the root
STATE_KEY = "neuron_second_moment"
KINDS = ("polar", "then_orthogonalize")


def check_rows(compiled: CompiledSpec, kind: str) -> None:
    """ValueError unless the kind ends in a polar factor and no orthogonal space acts on a covered matrix's rows."""
    if kind not in KINDS:
        raise ValueError(f"neuron_norm_beta2 normalizes the rows of a polar factor; preconditioner {kind!r} has none: "
                         "use preset='muon', 'then_orthogonalize' or 'soap_muon', or leave neuron_norm_beta2=None")
    for name in compiled.param_names:
        if len(compiled.shapes[name]) < 2:
            continue
        rotated = sorted({space for space in compiled.axis_spaces(name, 0)
                          if compiled.spaces[space]["group"] == "orthogonal"})
        if rotated:
            raise ValueError(
                f"neuron_norm_beta2: spec {compiled.name!r} rotates the rows of {name!r} (orthogonal space "
                f"{rotated[0]!r} on its axis 0); a per-row statistic would not rotate with them. Use a spec whose "
                "rows are permuted, sign-flipped or free (a Muon-style spec), or leave neuron_norm_beta2=None")


def normalize(updates: dict[str, torch.Tensor], states: dict[str, dict], beta2: float) -> dict[str, torch.Tensor]:
    """`updates` with each matrix's rows normalized; each parameter's state keeps its rows' EMA (created at zero)."""
    out = dict(updates)
    for name, z in updates.items():
        if z.ndim < 2:
            continue
        rows = z.reshape(z.shape[0], -1)
        work = rows if rows.dtype == torch.float64 else rows.float()
        st = states[name]
        if STATE_KEY not in st:
            st[STATE_KEY] = torch.zeros(rows.shape[0], 1, dtype=work.dtype, device=work.device)
        v = st[STATE_KEY].lerp(work.square().mean(dim=1, keepdim=True), 1 - beta2)
        st[STATE_KEY] = v
        normalized = work / (v.sqrt() + EPS)
        normalized = normalized * (work.norm() / (normalized.norm() + EPS))
        out[name] = normalized.reshape(z.shape).to(z.dtype)
    return out


__all__ = ["EPS", "KINDS", "STATE_KEY", "check_rows", "normalize"]
