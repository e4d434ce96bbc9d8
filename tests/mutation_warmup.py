"""A pytest plugin for mutation runs only (scripts/mutation.sh, `-p tests.mutation_warmup`).

mutmut forks one worker per mutant from a server that has collected the tests; without this, every
worker pays the first `symo.compile` (sympy, networkx and the kernel cache load lazily: seconds) and
torch's first linear-algebra calls. Importing this plugin in the server does that once, so the forked
workers inherit it. It tests nothing and changes no result.
"""

from __future__ import annotations

import torch

import symo
from symo.train.models import MLP


def _warm() -> None:
    for sizes, bias in (((5, 8, 6, 3), True), ((5, 8, 6, 3), False), ((8, 16, 12, 4), True),
                        ((8, 16, 12, 4), False)):
        model = MLP(sizes, bias=bias).double()
        specs = ("muon", "hidden_hidden", "shampoo_rows", "shampoo_cols") + (("mlp_tanh", "mlp_relu") if bias else ())
        for spec in specs:
            symo.compile(symo.load_spec(spec), model)
        opt = symo.Symo(model.named_parameters(), "muon", preconditioner="root", lr=0.01, beta2=0.9,
                        backend="newton_schulz")
        model(torch.randn(4, sizes[0], dtype=torch.float64)).square().sum().backward()
        opt.step()


_warm()
