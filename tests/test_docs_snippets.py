"""Every ```python snippet of the README and docs/ runs as written. A snippet may use objects from the
reader's own code (`model`, `grads`, `example_inputs`, ...): `USER` supplies small stand-ins for exactly
those names, per snippet, so a name the docs forget to define (as `v` once was in docs/hessian.md)
fails here with a NameError. Snippets run in an empty scratch folder, as outside the repository: a
snippet that reads "specs/..." fails here (bundled specs are named, e.g. "gpt_muon")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import symo

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def snippets() -> list[tuple[str, int, str]]:
    out = []
    for doc in DOCS:
        for i, code in enumerate(re.findall(r"```python\n(.*?)```", doc.read_text(encoding="utf-8"), re.S)):
            out.append((str(doc.relative_to(REPO)), i, code))
    return out


def _mlp_user() -> dict:
    torch.manual_seed(0)
    model = symo.models.mlp_tanh()
    x, y = torch.randn(16, 8), torch.randn(16, 4)
    w = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads = {n: torch.randn_like(p) for n, p in w.items()}

    def loss_fn(params):
        return ((torch.func.functional_call(model, params, (x,)) - y) ** 2).mean()

    return {"model": model, "grads": grads, "v": grads, "w": w, "loss_fn": loss_fn,
            "ema": symo.compile("mlp_tanh", model, disk_cache=False).zeros(), "x": x, "y": y}


def _gpt_user() -> dict:
    torch.manual_seed(0)
    model = symo.models.GPT(symo.models.GPTConfig(n_layer=1, n_head=2, n_embd=128, block_size=8, vocab_size=11))
    ids = torch.randint(0, 11, (2, 8))
    return {"model": model, "example_inputs": (ids,), "data": [(ids, ids)]}


def _gauge_user() -> dict:
    user = _mlp_user()
    Path("my_model.toml").write_text((REPO / "specs" / "mlp_tanh.toml").read_text())
    user.update(make_opt=lambda ps: symo.Symo(ps, "my_model.toml", lr=1e-2),
                loss=lambda out, target: ((out - target) ** 2).mean())
    return user  # a float32 model and float32 data, as a user has them: the snippet casts the data


def _laplace_user() -> dict:
    """A small MNIST-shaped classifier and loader (784 inputs, 10 classes), untrained: the snippet's
    calls are what is checked, not the posterior's quality."""
    torch.manual_seed(0)
    x = torch.randn(32, 784)
    y = torch.randint(0, 10, (32,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    return {"train_loader": loader, "x": x[:4]}


def _hf_user() -> dict:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=13, n_positions=8)
    return {"config": config}


# (doc, snippet index) -> the reader's objects the snippet uses; a snippet not listed gets none
USER = {
    ("README.md", 0): _mlp_user,              # Python API
    ("README.md", 1): lambda: {"symo": symo, **_gpt_user()},  # the Symo optimizer (continues the API section)
    ("README.md", 2): _mlp_user,              # the options by feature, on "your" MLP
    ("docs/gauge.md", 0): _gauge_user,        # check_equivariance on "your own model"
    ("docs/infer.md", 0): _gpt_user,          # infer_spec(model, example_inputs)
    ("docs/specs.md", 0): _hf_user,           # the Hugging Face GPT-2 spec
    ("docs/laplace.md", 0): _laplace_user,    # SymoLaplace on "a trained MLP" and its data loader
}


@pytest.mark.parametrize("doc,index,code", snippets(), ids=[f"{d}[{i}]" for d, i, _ in snippets()])
def test_doc_snippet_runs(doc: str, index: int, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no specs/ here: a snippet must name bundled specs as a user outside the repo does
    monkeypatch.setenv("SYMO_CACHE_DIR", str(tmp_path / "cache"))
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        namespace = USER.get((doc, index), dict)()
        exec(compile(code, f"{doc}[{index}]", "exec"), {"__name__": "__snippet__", **namespace})
    finally:
        torch.set_num_threads(n)


def test_every_user_entry_names_a_snippet() -> None:
    known = {(d, i) for d, i, _ in snippets()}
    assert set(USER) <= known, set(USER) - known
