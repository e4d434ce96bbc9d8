"""Spec inference finds head permutations: the inferred head owner is `perm` (heads permuted as wholes, each with
its own O(d_head) on q/k and on v/o: the wreath product of docs/specs.md, Example 4) wherever attention treats its
heads alike, and stays `identity` where a fixed tensor ties each head to its slot (ALiBi's per-head slopes).

Three model kinds: `nn.MultiheadAttention`, `F.scaled_dot_product_attention` on heads split from a fused or from
separate q/k/v projections, and the bundled GPT (symo.train.models). The oracle is `symo.check_symmetry`: dense group
elements through `CompiledSpec.act` on a float64 loss, independent of the inference's own index-based check; and for
ALiBi, that the head permutation the inference refuses really changes the loss."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import symo
from symo.infer import infer, ops_nn
from symo.train.models import GPT, GPTConfig, gpt_small

pytestmark = pytest.mark.usefixtures("one_thread_module")

HEADS, D_HEAD = 3, 4
D = HEADS * D_HEAD  # nn.MultiheadAttention splits its width into the heads


class SDPA(nn.Module):
    """tanh input layer, one attention block on a residual (heads split by a view, then
    scaled_dot_product_attention), a linear read-out. `fused`: one projection to [q | k | v], split; else three.
    `alibi`: ALiBi's fixed per-head slopes times the causal distance, added through attn_mask (a head-specific
    positional bias); `written_out`: attention as softmax(q k^T / sqrt(d) + bias) v instead of the fused call.
    `head_gain`: a learned per-head scale on each head's output."""

    def __init__(self, fused: bool = False, alibi: bool = False, head_gain: bool = False,
                 written_out: bool = False) -> None:
        super().__init__()
        self.fused, self.written_out = fused, written_out
        self.inp, self.out = nn.Linear(3, D), nn.Linear(D, 2)
        if fused:
            self.qkv = nn.Linear(D, 3 * HEADS * D_HEAD)
        else:
            self.q, self.k, self.v = (nn.Linear(D, HEADS * D_HEAD) for _ in range(3))
        self.o = nn.Linear(HEADS * D_HEAD, D)
        self.gain = nn.Parameter(torch.rand(HEADS) + 0.5) if head_gain else None
        self.register_buffer("slopes", 2.0 ** -torch.arange(1.0, HEADS + 1) if alibi else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.inp(x))
        b, t, _ = x.shape
        qkv = self.qkv(x).split(HEADS * D_HEAD, dim=-1) if self.fused else (self.q(x), self.k(x), self.v(x))
        q, k, v = (z.view(b, t, HEADS, D_HEAD).transpose(1, 2) for z in qkv)
        mask = None
        if self.slopes is not None:
            pos = torch.arange(t, device=x.device)
            mask = self.slopes.to(x.dtype)[:, None, None] * (pos[None, :] - pos[:, None]).clamp(max=0).to(x.dtype)
        if self.written_out:
            scores = q @ k.transpose(-1, -2) / D_HEAD**0.5
            y = torch.softmax(scores if mask is None else scores + mask, dim=-1) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        if self.gain is not None:
            y = y * self.gain.view(1, -1, 1, 1)
        return self.out(x + self.o(y.transpose(1, 2).reshape(b, t, -1)))


class MHA(nn.Module):
    """nn.MultiheadAttention between a tanh input layer and a read-out; `head_masks`: a fixed float mask per head
    (attn_mask of shape (batch * heads, L, S)), which ties each head to its slot."""

    def __init__(self, head_masks: bool = False) -> None:
        super().__init__()
        self.emb, self.out = nn.Linear(3, D), nn.Linear(D, 2)
        self.att = nn.MultiheadAttention(D, HEADS, batch_first=True)
        self.register_buffer("masks", torch.randn(2 * HEADS, 5, 5) if head_masks else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.emb(x))
        mask = None if self.masks is None else self.masks.to(h.dtype)
        return self.out(self.att(h, h, h, need_weights=False, attn_mask=mask)[0])


def tiny_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=2, n_head=HEADS, n_embd=HEADS * D_HEAD, block_size=8, vocab_size=11))


def float_inputs() -> tuple[torch.Tensor]:
    return (torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(0)),)


def gpt_inputs() -> tuple[torch.Tensor]:
    return (torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(0)),)


def holds(model: nn.Module, spec: symo.Spec, inputs: tuple) -> symo.SymmetryReport:
    """symo.check_symmetry of a float64 regression loss on the model's outputs, through CompiledSpec.act."""
    compiled = symo.compile(spec, model, disk_cache=False)
    params = {n: p.detach().double() for n, p in model.named_parameters()}
    buffers = {n: b.double() for n, b in model.named_buffers()}
    inputs = tuple(x.double() if x.is_floating_point() else x for x in inputs)

    def outputs(w: dict[str, torch.Tensor]) -> torch.Tensor:
        out = torch.func.functional_call(model, {**w, **buffers}, inputs)
        return out[0] if isinstance(out, tuple) else out

    target = torch.randn(outputs(params).shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    return symo.check_symmetry(lambda w: (outputs(w) - target).pow(2).mean(), compiled, params, trials=4)


def owners(result: symo.infer.Inference) -> dict[str, str]:
    """head owner -> its group; and every per-space names its owner."""
    per = {s.per for s in result.spaces if s.per is not None}
    assert per, result.report()
    return {s.name: s.group for s in result.spaces if s.name in per}


CASES = {
    "nn.MultiheadAttention": (MHA, float_inputs),
    "sdpa, separate q/k/v": (SDPA, float_inputs),
    "sdpa, fused qkv split": (lambda: SDPA(fused=True), float_inputs),
    "matmul-softmax-matmul": (lambda: SDPA(written_out=True), float_inputs),
    "bundled GPT": (tiny_gpt, gpt_inputs),
}


@pytest.mark.parametrize("case", list(CASES))
def test_heads_are_inferred_permutable_and_the_group_holds(case: str) -> None:
    make, inputs = CASES[case]
    torch.manual_seed(0)
    model = make()
    result = infer(model, inputs())
    heads = owners(result)
    assert set(heads.values()) == {"perm"}, result.report()
    assert all(s.status == "true" for s in result.spaces), result.report()
    per_head = {s.name: s.group for s in result.spaces if s.per in heads}
    assert sorted(per_head.values()).count("orthogonal") == 2 * len(heads), result.report()  # dqk and dvo per head
    assert "heads permuted as wholes" in result.report()
    report = holds(model, result.spec, inputs())
    assert report.is_true_symmetry, report
    # the spec file says it, and reads back
    assert symo.parse_spec(result.spec.to_toml()).spaces == result.spec.spaces


def test_a_learned_per_head_scale_moves_with_its_head() -> None:
    """A per-head parameter differs per head but is permuted along with the heads: still a true symmetry."""
    model = SDPA(head_gain=True)
    result = infer(model, float_inputs())
    assert set(owners(result).values()) == {"perm"}
    assert '"gain" = ["head"]' in result.spec.to_toml()
    assert holds(model, result.spec, float_inputs()).is_true_symmetry


def _with_owner(spec: symo.Spec, group: str) -> symo.Spec:
    text = spec.to_toml()
    assert '"head" = { group = "identity" }' in text
    return symo.parse_spec(text.replace('"head" = { group = "identity" }', f'"head" = {{ group = "{group}" }}'))


@pytest.mark.parametrize("written_out", [False, True], ids=["sdpa attn_mask", "scores + bias"])
def test_alibi_slopes_keep_each_head_in_its_slot(written_out: bool) -> None:
    """ALiBi: a fixed slope per head times the distance, added to the scores. Head i decays attention at its own
    rate, so moving its weights to slot j changes the function; the per-head rotations still hold."""
    torch.manual_seed(0)
    model = SDPA(alibi=True, written_out=written_out)
    result = infer(model, float_inputs())
    assert owners(result) == {"head": "identity"}, result.report()
    line = next(s for s in result.spaces if s.name == "head")
    assert "heads stay in place" in line.why and "fixed" in line.why, line.why
    assert sorted((s.group, s.per) for s in result.spaces if s.per) == [("orthogonal", "head")] * 2
    assert holds(model, result.spec, float_inputs()).is_true_symmetry
    # why the owner must stay identity: the same spec with the heads permuted is not a symmetry
    wrong = holds(model, _with_owner(result.spec, "perm"), float_inputs())
    assert not wrong.is_true_symmetry and wrong.max_rel_change > 1e-4, wrong


def test_per_head_masks_of_multihead_attention_keep_heads_in_place() -> None:
    torch.manual_seed(0)
    model = MHA(head_masks=True)
    result = infer(model, float_inputs())
    assert owners(result) == {"head": "identity"}, result.report()
    assert holds(model, result.spec, float_inputs()).is_true_symmetry
    assert not holds(model, _with_owner(result.spec, "perm"), float_inputs()).is_true_symmetry


def test_the_numeric_check_keeps_heads_in_place_when_the_graph_misses_the_tie(monkeypatch) -> None:
    """With the mask rule switched off, the graph proposes perm for the ALiBi heads; the float64 check measures
    the change, narrows the owner to identity (its per-head groups stay) and says why."""
    monkeypatch.setattr(ops_nn, "_pin_heads_by_mask", lambda *args: None)
    torch.manual_seed(0)
    model = SDPA(alibi=True)
    result = infer(model, float_inputs())
    head = next(s for s in result.spaces if s.name == "head")
    assert (head.group, head.inferred, head.status) == ("identity", "perm", "identity"), result.report()
    assert "heads stay in place: permuting them changes the output by" in head.why
    assert {s.group for s in result.spaces if s.per == "head"} == {"orthogonal"}
    assert result.joint_rel_change is not None and result.joint_rel_change <= result.tolerance
    assert holds(model, result.spec, float_inputs()).is_true_symmetry


def test_gpt_small_has_four_permutable_head_owners() -> None:
    """The bundled `gpt_small` itself (4 layers, 2 heads of 64): one perm owner per layer, checked by the inference."""
    torch.manual_seed(0)
    result = infer(gpt_small())
    assert owners(result) == {f"head{i}": "perm" for i in range(4)}, result.report()
    assert result.joint_rel_change is not None and result.joint_rel_change <= result.tolerance
    assert '"head{i}" = { group = "perm" }' in result.spec.to_toml()


def test_the_compile_report_names_and_explains_the_pooled_head_piece() -> None:
    """`symo compile` of an inferred spec: the head blocks are printed ind(head) x nat(d), their columns stay
    aligned, every line fits in 120 columns, and the legend says what `ind` is and where it is explained."""
    model = tiny_gpt()
    text = symo.compile(infer(model, gpt_inputs()).spec, model, disk_cache=False).describe()
    assert max(len(line) for line in text.splitlines()) <= 120
    rows = [line for line in text.splitlines() if "ind(head0) x nat(dqk0)" in line]
    assert len(rows) == 2 and len({line.index("  transformer") for line in rows}) == 1  # std(res) x ... too
    legend = " ".join(line.strip() for line in text.split("terms: ")[1].splitlines()[:4])
    assert "nat / std / ind" in legend and "ind(head) x nat(d) = heads permuted as wholes" in legend
    assert "docs/specs.md, Example 4" in legend
    specs_md = (Path(__file__).resolve().parents[1] / "docs" / "specs.md").read_text()
    assert "ind(head0) x nat(dqk0)" in specs_md  # where the legend sends the reader


def test_the_written_spec_names_the_exact_command(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`symo infer -o`: the header is the command that wrote the file, --relax muon included (before, only --model)."""
    out = tmp_path / "my spec.toml"
    assert symo.cli.main(["infer", "--model", "symo.train.models:mlp_tanh", "--relax", "muon", "--each",
                          "-o", str(out)]) == 0
    capsys.readouterr()
    first = out.read_text().splitlines()[0]
    assert first == f"# inferred by: symo infer --model symo.train.models:mlp_tanh --relax muon --each -o '{out}'"
    assert symo.parse_spec(out.read_text()).spaces  # the header is a comment: the file still reads back
