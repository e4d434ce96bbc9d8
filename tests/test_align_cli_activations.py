"""`symo align` / `symo merge` with --method activations and --data: exact recovery of a permuted copy,
the loss barrier line (naive vs aligned), and the refusal of --method activations without --data."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from symo.cli import main
from symo.train.models import MLP

MODEL = ["--model", "symo.train.models:mlp_relu", "--spec", "mlp_relu", "--no-progress"]


def _trained(seed: int, x: torch.Tensor, y: torch.Tensor, steps: int = 20) -> MLP:
    torch.manual_seed(seed)
    model = MLP((8, 16, 16, 4), act="relu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def _permuted(model: MLP, seed: int = 3) -> MLP:
    g = torch.Generator().manual_seed(seed)
    p1, p2 = torch.randperm(16, generator=g), torch.randperm(16, generator=g)
    s = {k: v.clone() for k, v in model.state_dict().items()}
    s["fc1.weight"], s["fc1.bias"] = s["fc1.weight"][p1], s["fc1.bias"][p1]
    s["fc2.weight"], s["fc2.bias"] = s["fc2.weight"][p2][:, p1], s["fc2.bias"][p2]
    s["fc3.weight"] = s["fc3.weight"][:, p2]
    out = MLP((8, 16, 16, 4), act="relu")
    out.load_state_dict(s)
    return out


@pytest.fixture
def setup(tmp_path):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    y = torch.randint(0, 4, (64,), generator=g)
    a, b = _trained(0, x, y), _trained(1, x, y)
    paths = {"a": tmp_path / "a.pt", "b": tmp_path / "b.pt", "perm": tmp_path / "perm.pt",
             "data": tmp_path / "data.pt", "inputs": tmp_path / "inputs.pt", "mse": tmp_path / "mse.pt"}
    torch.save(a.state_dict(), paths["a"])
    torch.save(b.state_dict(), paths["b"])
    torch.save(_permuted(a).state_dict(), paths["perm"])
    torch.save({"inputs": (x[:32], x[32:]), "targets": (y[:32], y[32:])}, paths["data"])
    torch.save(x, paths["inputs"])
    torch.save({"inputs": x, "targets": torch.randn(64, 4, generator=g)}, paths["mse"])
    return a, {k: str(v) for k, v in paths.items()}


def test_activations_recover_a_permuted_copy_exactly(setup, tmp_path, capsys) -> None:
    a, p = setup
    out = tmp_path / "aligned.pt"
    assert main(["align", p["a"], p["perm"], *MODEL, "--method", "activations", "--data", p["inputs"],
                 "-o", str(out)]) == 0
    got = torch.load(out, weights_only=True)
    want = a.state_dict()
    assert all(torch.allclose(got[k], want[k], atol=1e-6) for k in want)
    text = capsys.readouterr().out
    assert "barrier: skipped" in text and "no targets" in text


def test_barrier_line_with_data(setup, tmp_path, capsys) -> None:
    _, p = setup
    for method in ("weights", "activations"):
        assert main(["align", p["a"], p["b"], *MODEL, "--method", method, "--data", p["data"],
                     "-o", str(tmp_path / f"{method}.pt")]) == 0
        line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("loss barrier"))
        assert "cross-entropy" in line
        naive, aligned = (float(v) for v in re.findall(r"(?:naive|aligned) ([-0-9.e+]+)", line))
        assert naive > 0 and aligned < naive
    assert main(["merge", p["a"], p["b"], *MODEL, "--data", p["mse"], "-o", str(tmp_path / "merged.pt")]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("loss barrier"))
    assert "MSE" in line and "naive" in line and "aligned" in line


def test_activations_without_data_is_refused(setup, tmp_path, capsys) -> None:
    _, p = setup
    out = tmp_path / "never.pt"
    assert main(["align", p["a"], p["b"], *MODEL, "--method", "activations", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "--data" in err and len(err.splitlines()) == 1 and not out.exists()
