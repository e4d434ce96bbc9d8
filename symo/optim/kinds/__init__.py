"""The kinds of block preconditioner, one file each (the interface: kinds/base.py).

- polar: this step's statistic used at once, S^{-1/2} Y = sqrt(d) polar(Y): Muon's step (the default);
- root: the averaged statistic's power A^{power} Y: Shampoo (beta2 = 1), the early paper notebooks' rule;
- taylor: H = S_w^{-1} # S_g from the averaged statistic and the current weights;
- published: the published Symo step (momentum, the debiased momentum's centred statistic, S_w, damping);
- eigen_adam: Adam in each block's curvature eigenbasis (SOAP);
- then_orthogonalize: precondition by root or eigen_adam, then take the polar factor (PMuon, SOAP-Muon).
"""

from __future__ import annotations

from .base import Kind
from .eigen_adam import EigenAdam, EigenAdamConfig
from .options import KindConfig
from .polar import Polar, PolarConfig
from .published import Published, PublishedConfig
from .root import Root, RootConfig
from .taylor import Taylor, TaylorConfig
from .then_orthogonalize import ThenOrthogonalize, ThenOrthogonalizeConfig

# kind name -> (its config dataclass, its implementation)
KINDS: dict[str, tuple[type[KindConfig], type[Kind]]] = {
    "polar": (PolarConfig, Polar),
    "root": (RootConfig, Root),
    "taylor": (TaylorConfig, Taylor),
    "published": (PublishedConfig, Published),
    "eigen_adam": (EigenAdamConfig, EigenAdam),
    "then_orthogonalize": (ThenOrthogonalizeConfig, ThenOrthogonalize),
}

__all__ = ["KINDS", "EigenAdamConfig", "Kind", "KindConfig", "PolarConfig", "PublishedConfig", "RootConfig",
           "TaylorConfig", "ThenOrthogonalizeConfig"]
