"""symo.check_equivariance and its CLI: verdicts for the O(k) gauge of W = U V^T, in float64.

Oracle: the structure theorem of "The Loss Does Not See the Basis, but Adam Does" (the factored gauge):
rules built from Gram matrices / Frobenius norms commute with (U, V) -> (U Q, V Q); coordinate-wise
rules do not, and already fail at the first step (sign(G Q) != sign(G) Q).
"""

import math

import pytest
import torch

import symo
import symo.cli
from symo.experiments import zoo
from symo.train.models import Factored

EQUIVARIANT = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05),
    "heavy_ball": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    "nesterov_sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True),
    "scalar_adam": lambda ps: zoo.ScalarAdam(ps, lr=1e-2),
    "muon": lambda ps: zoo.Muon(ps, lr=3e-2),
    "shampoo": lambda ps: zoo.Shampoo(ps, lr=0.1, update_freq=3),
    "symo": lambda ps: symo.Symo(ps, "factored", lr=1e-2),
    "symo_ema": lambda ps: symo.Symo(ps, "factored", preconditioner="root", lr=1e-2, beta2=0.99, statistic="gradient"),
    "gd": lambda ps: zoo.GD(ps, lr=0.05),
}
NOT_EQUIVARIANT = {
    "adam": lambda ps: zoo.Adam(ps, lr=1e-2),
    "torch_adam": lambda ps: torch.optim.Adam(ps, lr=1e-2),
    "rmsprop": lambda ps: zoo.RMSProp(ps, lr=1e-3),
    "torch_rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=1e-3),
    "lion": lambda ps: zoo.Lion(ps, lr=1e-3),
    "signsgd": lambda ps: zoo.Signum(ps, lr=1e-3, beta=0.0),
    "signum": lambda ps: zoo.Signum(ps, lr=1e-3),
    "adafactor": lambda ps: zoo.Adafactor(ps, lr=1e-3),
    "adam_p_half": lambda ps: zoo.AdamP(ps, lr=1e-2, p=0.5),
}


@pytest.mark.parametrize("name", sorted(EQUIVARIANT))
def test_equivariant_rules_pass_to_float_precision(name):
    report = symo.check_equivariance(EQUIVARIANT[name], steps=8)
    assert report.is_symmetry and report.symmetry_defect < 1e-12
    assert report.is_equivariant, report.summary()
    assert max(report.divergence) < 1e-12
    assert "EQUIVARIANT" in report.summary()


@pytest.mark.parametrize("name", sorted(NOT_EQUIVARIANT))
def test_coordinatewise_rules_fail_at_the_first_step(name):
    report = symo.check_equivariance(NOT_EQUIVARIANT[name], steps=3)
    assert report.is_symmetry
    assert not report.is_equivariant
    assert report.first_step_defect > 1e-4, report.summary()
    assert "NOT equivariant" in report.summary()


class _CoordinateScaled(torch.optim.Optimizer):
    """A user's optimizer the checker has never seen: per-entry step g / (1 + |g|)."""

    def __init__(self, params, lr=0.1):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                p.add_(p.grad / (1 + p.grad.abs()), alpha=-group["lr"])


class _FrobeniusScaled(_CoordinateScaled):
    """Its equivariant cousin: the whole gradient scaled by a function of ||g||_F."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                p.add_(p.grad / (1 + p.grad.norm()), alpha=-group["lr"])


def test_any_user_optimizer_and_an_nn_module():
    model = Factored(7, 5, 4, scale=0.5)
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(20, 7, 5, generator=gen, dtype=torch.float64)
    y = torch.randn(20, generator=gen, dtype=torch.float64)

    def loss(module):
        return ((torch.einsum("imn,mn->i", a, module()) - y) ** 2).mean()

    good = symo.check_equivariance(lambda ps: _FrobeniusScaled(ps), model, "factored", loss, steps=5)
    bad = symo.check_equivariance(lambda ps: _CoordinateScaled(ps), model, "factored", loss, steps=5)
    assert good.is_equivariant and good.divergence[0] == 0.0
    assert not bad.is_equivariant and bad.first_step_defect > 1e-4
    assert model.U.dtype == torch.float32  # the user's model is left alone (twins are float64 copies)


def test_shared_scalar_adam_exact_and_adam_not_at_step_one():
    scalar = symo.check_equivariance(EQUIVARIANT["scalar_adam"], steps=1)
    adam = symo.check_equivariance(NOT_EQUIVARIANT["adam"], steps=1)
    assert scalar.first_step_defect < 1e-14
    assert adam.first_step_defect > 1e-3


def test_a_loss_the_group_does_not_preserve_is_reported():
    params = {"U": torch.randn(4, 3, dtype=torch.float64), "V": torch.randn(5, 3, dtype=torch.float64)}
    report = symo.check_equivariance(EQUIVARIANT["sgd"], params, "factored", lambda w: (w["U"] ** 4).sum(), steps=2)
    assert not report.is_symmetry and not report.is_equivariant
    assert "NOT A SYMMETRY" in report.summary()


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="steps"):
        symo.check_equivariance(EQUIVARIANT["sgd"], steps=0)
    with pytest.raises(ValueError, match="spec= and loss_fn="):
        symo.check_equivariance(EQUIVARIANT["sgd"], Factored(3, 3, 2))
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        symo.check_equivariance(lambda ps: object())
    with pytest.raises(ValueError, match="tolerance must be a number >= 0, got -1"):
        symo.check_equivariance(EQUIVARIANT["sgd"], tolerance=-1)
    model = symo.models.mlp_tanh()
    x, y = torch.randn(6, 8), torch.randn(6, 4)  # float32 data, the twins float64: the message says to cast
    with pytest.raises(TypeError, match=r"float64 copy of the model.*lambda m: loss\(m\(x.double\(\)\), y.double"):
        symo.check_equivariance(EQUIVARIANT["sgd"], model, "mlp_tanh", lambda m: ((m(x) - y) ** 2).mean())


def test_soap_kinds_are_not_equivariant_to_rotations_as_the_docs_say():
    """docs/gauge.md: on the default O(k) problem the SOAP presets end well apart, Symo's default and muon do not."""
    for preset in ("soap", "soap_muon"):
        report = symo.check_equivariance(lambda ps, p=preset: symo.Symo(ps, "factored", lr=1e-2, preset=p))
        assert report.divergence[1] == 0.0 and report.final_divergence > 0.05, preset  # first step only gathers
    assert symo.check_equivariance(lambda ps: symo.Symo(ps, "factored", lr=1e-2, preset="muon")).is_equivariant


def test_cli_verdicts_and_exit_status(capsys):
    assert symo.cli.main(["equivariance", "heavy_ball", "muon", "symo", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count("EQUIVARIANT") == 3
    assert symo.cli.main(["equivariance", "sgd", "adam", "--steps", "2"]) == 1
    out = capsys.readouterr().out
    assert "adam: NOT equivariant" in out
    assert symo.cli.main(["equivariance", "nonesuch"]) == 2
    assert capsys.readouterr().err.startswith("error: unknown optimizer 'nonesuch'")
    assert symo.cli.main(["equivariance", "sgd", "--model", "symo.train.models:factored"]) == 2
    for flags, message in ((["--steps", "0"], "--steps must be at least 1, got 0"),
                           (["--tolerance", "-1"], "--tolerance must be a number >= 0, got -1"),
                           (["--spec", "mlp_tanh"], "--spec is the symmetry of --model")):
        assert symo.cli.main(["equivariance", "sgd", *flags]) == 2
        assert message in capsys.readouterr().err


def test_cli_on_a_model_of_ones_own_uses_its_spec_and_goes_on_past_a_rule_that_cannot_take_it(tmp_path, capsys,
                                                                                              monkeypatch):
    (tmp_path / "mine.py").write_text(
        "import torch\nimport symo\n"
        "def model():\n    return symo.models.mlp_tanh()\n"
        "def loss(m):\n    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)\n"
        "    return m(x).pow(2).mean()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["--model", "mine:model", "--loss", "mine:loss", "--spec", "mlp_tanh", "--steps", "2"]
    assert symo.cli.main(["equivariance", "symo", "muon", "sgd", *args]) == 2  # muon takes no biases: an error
    captured = capsys.readouterr()
    assert "symo: EQUIVARIANT" in captured.out and "sgd: EQUIVARIANT" in captured.out  # the run went on
    assert "muon: error: Muon takes matrices only" in captured.err and "module:factory" in captured.err


def test_factored_problem_is_gauge_invariant():
    params, loss = symo.gauge.factored_problem(seed=1)
    q, _ = torch.linalg.qr(torch.randn(4, 4, dtype=torch.float64))
    moved = {"U": params["U"] @ q, "V": params["V"] @ q}
    assert math.isclose(float(loss(moved)), float(loss(params)), rel_tol=1e-12)
