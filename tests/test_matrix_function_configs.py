"""The matrix functions as frozen configs (symo/optim/matrix_function_configs.py): their validation messages, the old
string spellings and flat ns_* keywords as spellings of them, and bit-identical steps either way."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import symo
from symo.optim import Auto, CoupledNewton, Eigh, NewtonSchulz, PowerQR, SymoConfig
from symo.optim.matrix_function_configs import MUON_COEFFS
from symo.runtime import linalg
from symo.train.models import MLP

MUON = Path(__file__).resolve().parent.parent / "specs" / "muon.toml"


def test_the_configs_are_frozen_hashable_and_print_only_what_differs():
    ns = NewtonSchulz(steps=3)
    with pytest.raises(AttributeError):
        ns.steps = 4  # type: ignore[misc]
    assert {ns, NewtonSchulz(steps=3)} == {ns}
    assert repr(ns) == "NewtonSchulz(steps=3)" and repr(Eigh()) == "Eigh()"
    assert repr(Auto(eigh_max_size=64)) == "Auto(eigh_max_size=64)"
    assert MUON_COEFFS == linalg.MUON_COEFFS  # the torch-free copy is linalg's
    assert NewtonSchulz(coeffs=[1.5, -0.5, 0]).coeffs == (1.5, -0.5, 0.0)  # a list (from JSON) becomes a tuple


@pytest.mark.parametrize("make,exc,message", [
    (lambda: NewtonSchulz(steps=2.5), TypeError, "NewtonSchulz.steps must be an int, got 2.5"),
    (lambda: NewtonSchulz(steps=0), ValueError, "NewtonSchulz.steps must be >= 1, got 0 (Muon uses 5)"),
    (lambda: NewtonSchulz(coeffs=(1.0, 2.0)), ValueError,
     "NewtonSchulz.coeffs must be three finite numbers (a, b, c), got (1.0, 2.0)"),
    (lambda: NewtonSchulz(coeffs="abc"), TypeError, "NewtonSchulz.coeffs must be a tuple of numbers, got 'abc'"),
    (lambda: NewtonSchulz(dtype="float16"), ValueError,
     "NewtonSchulz.dtype must be one of 'float32', 'bfloat16'; got 'float16'"),
    (lambda: NewtonSchulz(method=1), TypeError,
     "NewtonSchulz.method must be one of 'auto', 'iterate', 'spectral'; got 1"),
    (lambda: NewtonSchulz(method="spectral", dtype="bfloat16"), ValueError,
     "NewtonSchulz.method='spectral' evaluates Newton-Schulz through a float32/float64 eigh; NewtonSchulz.dtype="
     "'bfloat16' applies to the iteration only: use NewtonSchulz.method='iterate' (or 'auto') with bfloat16"),
    (lambda: CoupledNewton(steps=0), ValueError,
     "CoupledNewton.steps must be >= 1, got 0 (25 reaches float64 accuracy at relative damping 1e-6)"),
    (lambda: Auto(eigh_max_size=0), ValueError, "Auto.eigh_max_size must be >= 1, got 0"),
    (lambda: Auto(iteration=Eigh()), TypeError,
     "Auto.iteration must be None, NewtonSchulz(...) or CoupledNewton(...), got Eigh()"),
    (lambda: PowerQR(iterations=0), ValueError, "PowerQR.iterations must be an int >= 1, got 0"),
])
def test_a_config_refuses_a_bad_field_naming_it(make, exc, message):
    with pytest.raises(exc, match="^" + re.escape(message) + "$"):
        make()


@pytest.mark.parametrize("options,message", [
    ({"backend": 3}, "backend must be one of 'auto', 'eigh', 'newton_schulz' or a config Auto(...), Eigh(), "
                     "NewtonSchulz(...) (symo.optim); got 3"),
    ({"backend": "qr"}, "backend must be one of 'auto', 'eigh', 'newton_schulz' or a config Auto(...), Eigh(), "
                        "NewtonSchulz(...) (symo.optim); got 'qr'"),
    ({"backend": CoupledNewton()}, "backend must be one of 'auto', 'eigh', 'newton_schulz' or a config Auto(...), "
                                   "Eigh(), NewtonSchulz(...) (symo.optim); got CoupledNewton()"),
    ({"preconditioner": "root", "backend": Auto(iteration=NewtonSchulz())},
     "backend=Auto(iteration=NewtonSchulz()): preconditioner 'root' iterates with CoupledNewton(...), not "
     "NewtonSchulz; pass CoupledNewton(...), Auto(iteration=CoupledNewton(...)) or Auto()"),
    ({"inverse_root": NewtonSchulz()}, "inverse_root must be CoupledNewton(...), got NewtonSchulz()"),
    ({"ns_steps": 2.5}, "ns_steps must be an int, got 2.5"),
    ({"ns_inverse_steps": 0},
     "ns_inverse_steps must be >= 1, got 0 (25 reaches float64 accuracy at relative damping 1e-6)"),
    ({"preconditioner": "root", "ns_inverse_steps": "9"}, "ns_inverse_steps must be an int, got '9'"),
])
def test_a_kind_refuses_a_wrong_matrix_function_naming_the_option(options, message):
    with pytest.raises((TypeError, ValueError), match="^" + re.escape(message) + "$"):
        SymoConfig(**options)


def test_the_string_spellings_and_flat_keywords_build_the_configs():
    assert SymoConfig().backend == Auto(iteration=NewtonSchulz())
    assert SymoConfig(backend="eigh").backend == Eigh()
    assert SymoConfig(backend="newton_schulz", ns_steps=3, ns_method="iterate").backend == NewtonSchulz(
        steps=3, method="iterate")
    assert SymoConfig(eigh_max_size=64, ns_dtype="bfloat16").backend == Auto(64, NewtonSchulz(dtype="bfloat16"))
    root = SymoConfig(preconditioner="root", backend="newton_schulz", ns_inverse_steps=40)
    assert root.backend == CoupledNewton(steps=40) and root.ns_inverse_steps == 40
    assert SymoConfig(preconditioner="root").backend == Auto(iteration=CoupledNewton())
    assert SymoConfig(preconditioner="root", backend=Auto(eigh_max_size=7)).backend == Auto(7, CoupledNewton())
    polar = SymoConfig(statistic="gradient", ns_inverse_steps=60)
    assert polar.preconditioner.inverse_root == CoupledNewton(steps=60)
    # read back by their flat names; with Eigh() a shortcut sets nothing and reads the iteration's default
    cfg = SymoConfig(backend=NewtonSchulz(steps=7, coeffs=(1.5, -0.5, 0.0)))
    assert (cfg.ns_steps, cfg.ns_coeffs, cfg.eigh_max_size) == (7, (1.5, -0.5, 0.0), 128)
    assert SymoConfig(backend="eigh", ns_steps=3).ns_steps == 5
    # a string that replaces a config keeps its settings
    assert cfg.replace(backend="auto").backend == Auto(iteration=NewtonSchulz(steps=7, coeffs=(1.5, -0.5, 0.0)))
    assert SymoConfig(eigh_max_size=9).replace(backend="newton_schulz").replace(backend="auto").eigh_max_size == 128
    # then_orthogonalize: the polar factor's backend, the inner root's own (eigh)
    then = SymoConfig(preconditioner="then_orthogonalize", inner="root", backend="newton_schulz", ns_steps=4)
    assert then.preconditioner.backend == NewtonSchulz(steps=4) and then.preconditioner.inner.backend == Eigh()
    # the muon preset's flat keywords
    muon = SymoConfig(**symo.PRESETS["muon"].values)
    assert muon.backend == NewtonSchulz(method="iterate")


def test_a_matrix_function_is_fixed_once_the_optimizer_is_built():
    opt = symo.Symo(MLP((6, 8, 4)).named_parameters(), MUON, lr=0.02)
    for name in ("backend", "ns_steps", "eigh_max_size"):
        with pytest.raises(AttributeError, match=f"^{name} is fixed when the optimizer is built"):
            setattr(opt.config, name, 3)


def _steps(options: dict, spec: Path = MUON, steps: int = 3) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = MLP((12, 16, 16, 4), bias=False)
    model0 = copy.deepcopy(model)
    opt = symo.Symo(model.named_parameters(), spec, lr=0.02, **options)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(8, 12, generator=gen)
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    return [p.detach() - q.detach() for p, q in zip(model.parameters(), model0.parameters())]


@pytest.mark.parametrize("old,new", [
    ({"backend": "newton_schulz", "ns_steps": 4, "ns_method": "iterate", "update_scale": "muon"},
     {"backend": NewtonSchulz(steps=4, method="iterate"), "update_scale": "muon"}),
    ({"backend": "auto", "eigh_max_size": 8, "ns_coeffs": (1.5, -0.5, 0.0)},
     {"backend": Auto(eigh_max_size=8, iteration=NewtonSchulz(coeffs=(1.5, -0.5, 0.0)))}),
    ({"backend": "eigh"}, {"backend": Eigh()}),
    ({"statistic": "gradient", "backend": "newton_schulz", "ns_inverse_steps": 40, "damping": 1e-3},
     {"statistic": "gradient", "backend": NewtonSchulz(), "inverse_root": CoupledNewton(steps=40), "damping": 1e-3}),
    ({"preconditioner": "root", "backend": "newton_schulz", "ns_inverse_steps": 40, "beta2": 0.9, "damping": 1e-3},
     {"preconditioner": "root", "backend": CoupledNewton(steps=40), "beta2": 0.9, "damping": 1e-3}),
    ({"preconditioner": "then_orthogonalize", "inner": "root", "backend": "newton_schulz", "ns_steps": 6},
     {"preconditioner": "then_orthogonalize", "inner": "root", "backend": NewtonSchulz(steps=6)}),
], ids=["polar-ns", "polar-auto", "polar-eigh", "polar-gradient", "root-coupled", "then_orthogonalize"])
def test_the_old_spelling_and_the_config_take_bit_identical_steps(old, new):
    for a, b in zip(_steps(old), _steps(new)):
        assert torch.equal(a, b)


def test_the_config_module_imports_no_torch():
    code = ("import sys; import symo.optim.matrix_function_configs as m, symo.optim.presets; "
            "assert 'torch' not in sys.modules, 'torch imported'; print(m.NewtonSchulz(steps=3))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "NewtonSchulz(steps=3)"
