"""The accuracy rows of benchmarks/step_overhead.py: Muon's Newton-Schulz iteration in bfloat16 against float32
and the float64 polar factor, and the spectral evaluation against the float64 iteration."""

from __future__ import annotations

import torch

from symo.runtime.linalg import newton_schulz, newton_schulz_spectral


def bf16_accuracy(device: torch.device, shape: tuple[int, int] = (384, 1536)) -> dict:
    """Muon's quintic Newton-Schulz in bfloat16 against float32 and the float64 polar factor."""
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(device)
    u, _, vh = torch.linalg.svd(g.double().cpu(), full_matrices=False)
    polar = (u @ vh).to(device)
    f32 = newton_schulz(g).double()
    bf16 = newton_schulz(g.to(torch.bfloat16)).double()

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return ((a - b).norm() / b.norm()).item()

    return {"shape": list(shape), "bf16_vs_f32": rel(bf16, f32), "f32_vs_polar": rel(f32, polar),
            "bf16_vs_polar": rel(bf16, polar)}


def spectral_accuracy() -> dict[str, dict[str, float]]:
    """The spectral evaluation against the float64 iteration, beside the float32 iteration (CPU).

    The per-head MLP block's shape (769 x 1536, a float32 eigh above linalg.FLOAT64_EIGH_MAX) and a
    Muon-style one (384 x 1536, float64 Gram), each as a Gaussian and as a rank-64 matrix whose
    singular values span 6 decades (where an eigendecomposition is least accurate)."""
    gen = torch.Generator().manual_seed(0)
    out = {}
    for rows in (769, 384):
        for kind in ("gaussian", "rank-64, 6 decades"):
            if kind == "gaussian":
                g = torch.randn(rows, 1536, generator=gen)
            else:
                left = torch.randn(rows, 64, generator=gen) * torch.logspace(0, -6, 64)
                g = left @ torch.randn(64, 1536, generator=gen)
            truth = newton_schulz(g.double())
            out[f"{rows}x1536 {kind}"] = {name: ((f(g).double() - truth).norm() / truth.norm()).item()
                                          for name, f in (("spectral", newton_schulz_spectral),
                                                          ("iterate", newton_schulz))}
    return out
