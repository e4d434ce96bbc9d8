"""The studies of benchmarks/soap_gap.py: SOAP's conventions and settings, one change at a time, on the nanoGPT
reference regime.

Fifteen studies, each at its preset's tuned rate and decay on the gpt_muon spec (unless the study or a variant names
another), for the campaign's three seeds (same initialization and batches), each variant paired with its study's base
seed by seed:

- `soap`: which convention separates the authors' SOAP from heavyball's. In benchmarks/results/nanogpt_matrix.md,
  Symo's `soap` preset (the authors' algorithm and defaults) ends level with the authors' own SOAP and behind
  heavyball's SOAP, while `soap_heavyball` (the same algorithm with heavyball's conventions) ends level with
  heavyball's. The presets differ in two defaults (beta1 0.95 against 0.9; the eigenbasis refreshed every 10
  steps against every 2) and in three details (the refresh one step earlier, eps as a clamp, a shift in the QR
  step). The study changes one default at a time on `soap`, then both.
- `soap_muon`: whether longer memory in SOAP-Muon's two averages (Adam's second moment in the eigenbasis,
  `adam_beta2`; the Kronecker statistics, `beta2`; both 0.95 as in SOAP) moves `symo train`'s default step
  closer to reaching Muon's loss in 0.85x Muon's steps. At 4096 tokens a step the gradient is noisy, and an
  average over about 20 steps is a noisy estimate of either. Its last rows add heavyball's shifted QR step alone,
  and NorMuon's row normalization after the polar factor (`neuron_norm_beta2`, symo/optim/neuron_norm.py); the
  latter also runs seeds 3-5, reported beside SOAP-Muon and Muon on six seeds (their seeds 3-5 from
  benchmarks/soap_seeds.py's run cache), since the 0.85x goal is about a figure that moves by 0.1x between
  three-seed subsets.
- `qkv` and `qkv_muon`: which coordinates form a block. The spec gpt_muon_qkv makes c_attn's query, key and value
  rows three matrices (each its own polar factor, and under SOAP-Muon its own two Kronecker sides) where gpt_muon
  keeps the one 3 d x d matrix; the first study asks it of SOAP-Muon (with seeds 3-5, as above), the second of
  Muon's own step (Symo's defaults at their tuned rate and decay).
- `qkv_refresh`: how often SOAP-Muon refreshes its two Kronecker bases on gpt_muon_qkv (`symo train`'s default):
  every 10 steps (the preset, the authors' SOAP), 5 or 2 (heavyball's). Refreshing every 2 was worth 0.008 to
  `soap` in the first study; the campaign's heavyball-refresh SOAP-Muon arm changed four details at once.
- `decay_soap_muon` and `decay_heavyball`: a decay past the campaign's grid. At 0.26x Chinchilla SOAP-Muon on
  gpt_muon_qkv and heavyball's SOAP both chose 0.1, the largest of {0, 0.05, 0.1}, where Muon's choice (0.05) is
  inside it; the campaign extends a rate grid at its edge but not the decay's. Each runs its arm at 0.2 beside 0.1
  (heavyball's SOAP as the campaign builds it); SOAP-Muon also at 0.05, the decay `symo train` defaults to
  (SOAP-Muon's tuned choice at 2x Chinchilla), for the default step's figure here, with seeds 3-5 too.
- `qkv_polar_sides`: what two of SOAP-Muon's details are worth on gpt_muon_qkv. Its polar factor is exact (Symo's
  Auto takes it by eigh for sides up to 128, all of this model's), where the Muon arm runs Muon's quintic
  Newton-Schulz, whose map sends singular values above about 0.3% of the matrix's Frobenius norm to between 0.68 and
  1.13 and shrinks smaller ones; and it rotates both Kronecker sides. One variant takes the polar factor by Muon's
  iteration, one rotates only the input side, W's columns (`two_sided=False`); the latter also runs seeds 3-5, paired
  with the base's seeds 3-5 from the `qkv` study.
- `qkv_signed_root`: the SOAP authors' own SOAP-Muon code does one more thing after the polar factor: the signed
  square root of its coordinates in SOAP's eigenbasis, rescaled to the polar factor's norm (`eigenbasis_power=0.5`).
- `qkv_rotation`: what SOAP's eigenbasis rotation is worth to SOAP-Muon. Without it (`max_precond_dim=1`: no side
  rotated) the step is Adam's second moment in the weights' own coordinates, then the polar factor; rotating the
  momentum alone would change nothing, since the polar factor commutes with rotations. With `max_precond_dim=128`
  the MLP's 512-wide sides, whose statistics and QR refreshes cost the most, stay unrotated. The unrotated variant
  also runs seeds 3-5 (paired with the `qkv` study's): it keeps no statistics, and ended ahead of Muon on each of the
  campaign's seeds.
- `mlp_coupling_muon`: what coupling each MLP's c_fc rows and c_proj columns into one block through their hidden
  units (the spec gpt_muon_qkv_mlp) does to Muon's own step, with no statistics: the part of the coupling's cost to
  SOAP-Muon (its campaign arm, behind gpt_muon_qkv's at 0.26x Chinchilla) that one polar factor over the two
  matrices carries, apart from SOAP's bases over the stacked coordinates. At Muon's step's tuned rate and decay on
  gpt_muon_qkv, which the coupled SOAP-Muon arm chose too.
- `true_rms`: SOAP-Muon on gpt_true with the per-parameter RMS (`parameter_rms`, Symo's default), which the
  campaign's gpt_true arm ran without (Muon's per-block factor alone). The per-parameter RMS exists so that one rate
  serves every spec of a model, so the variant runs at the arm's tuned rate and decay rather than on its own grid.
- `true_attention`: what the true symmetry's per-head attention gauges do to SOAP-Muon alone. The study spec
  benchmarks/specs/gpt_true_attention.toml is gpt_true's attention (per-head O(d_head) on query/key and on
  value/output, c_attn's bias with them) with gpt_muon_qkv's MLP, run beside SOAP-Muon on gpt_muon_qkv at its
  tuned rate and decay, which the gpt_true arm chose too. With the campaign's gpt_muon_qkv_mlp arm (the MLP's
  coupling alone) it splits what gpt_true loses to gpt_muon_qkv.
- `true_mlp`: what the rest of the true symmetry's MLP does to SOAP-Muon beside the coupling. The study spec
  benchmarks/specs/gpt_true_mlp.toml is gpt_muon_qkv_mlp with gpt_true's MLP: plain permutations of the hidden
  units in place of signed ones (the invariant mean direction of every layer's hidden units then splits off, and all
  layers' stack into one block of their own) and c_fc's bias moved with its hidden units. It runs beside the
  campaign's gpt_muon_qkv_mlp arm at its tuned rate and decay; with `true_attention` it measures each part by which
  gpt_true differs from gpt_muon_qkv, where the campaign measured only their sum.
- `heavyball_details`: which of heavyball's three details carries the rest of the first study's gap. From `soap`
  with heavyball's two defaults, it adds one detail at a time; its last row, `soap_heavyball`, has all three.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from benchmarks.nanogpt_matrix_runs import SOAP_MUON
from symo.optim import NewtonSchulz, PowerQR

REGIME, SEEDS = "reference", (0, 1, 2)
# a variant that also runs seeds 3-5, paired with Muon's seeds 3-5 from benchmarks/soap_seeds.py's run cache and with
# its base's (from there too where the base is a campaign arm): the 0.85x goal is about figures that move by 0.1x
# between three-seed subsets
SIX_SEEDS, EXTRA_SEEDS = {"soap_muon": "soap_muon_neuron_norm", "qkv": "soap_muon_qkv",
                           "qkv_polar_sides": "soap_muon_qkv_one_sided", "qkv_rotation": "soap_muon_qkv_unrotated",
                           "decay_soap_muon": "soap_muon_qkv_wd_0.05"}, (3, 4, 5)


def six_seeded(study_name: str, variant: str) -> bool:
    """Whether `variant` of the study runs seeds 3-5 too: the study's six-seed variant, and its base where the base
    is no campaign arm (a campaign arm's seeds 3-5 are soap_seeds' runs)."""
    study = STUDIES[study_name]
    return study_name in SIX_SEEDS and (variant == SIX_SEEDS[study_name] or (
        variant == study.base and study.variants[study.base][1] is None))


@dataclass(frozen=True)
class Study:
    """Variants of one preset at one (rate, decay). `variants`: name -> (label, the campaign arm whose runs it
    reuses or None, the Symo options, or None for the campaign arm itself, run here where its cache lacks the
    run); the first variant is the base every other is paired with. `spec`: the bundled spec its variants run on;
    `specs`: a variant's own where it is another. `wds`: the decay of a variant that runs at another than the
    study's."""

    title: str
    lr: float
    wd: float
    variants: dict[str, tuple[str, str | None, dict | None]]
    spec: str = "gpt_muon"
    specs: dict[str, str] = field(default_factory=dict)
    wds: dict[str, float] = field(default_factory=dict)

    @property
    def base(self) -> str:
        return next(iter(self.variants))


STUDIES: dict[str, Study] = {
    "soap": Study("Which convention separates the authors' SOAP from heavyball's", 6e-3, 0.0, {
        "soap": ("soap (the authors' conventions)", "symo_soap_gpt_muon", {"preset": "soap"}),
        "soap_beta1_0.9": ("soap, beta1 0.9", None, {"preset": "soap", "beta1": 0.9}),
        "soap_refresh_2": ("soap, refresh every 2 steps", None, {"preset": "soap", "precondition_frequency": 2}),
        "soap_both_defaults": ("soap, beta1 0.9 and refresh every 2 (heavyball's defaults, the authors' details)",
                               None, {"preset": "soap", "beta1": 0.9, "precondition_frequency": 2}),
        "soap_heavyball": ("soap_heavyball (all of heavyball's conventions)", "symo_soap_heavyball_gpt_muon",
                           {"preset": "soap_heavyball"}),
    }),
    # the campaign's SOAP-Muon arm is the soap_muon preset (tests/test_presets.py checks it)
    "soap_muon": Study("SOAP-Muon: longer memory in its averages than SOAP's 0.95, the shifted QR step, NorMuon's "
                       "rows", 0.02, 0.1, {
        "soap_muon": ("SOAP-Muon (betas 0.95)", "symo_soap_muon_gpt_muon", SOAP_MUON),
        "soap_muon_adam_beta2_0.99": ("SOAP-Muon, adam_beta2 0.99 (Adam's second moment)", None,
                                      {**SOAP_MUON, "adam_beta2": 0.99}),
        "soap_muon_beta2_0.99": ("SOAP-Muon, beta2 0.99 (the Kronecker statistics)", None,
                                 {**SOAP_MUON, "beta2": 0.99}),
        "soap_muon_both_0.99": ("SOAP-Muon, adam_beta2 and beta2 0.99", None,
                                {**SOAP_MUON, "adam_beta2": 0.99, "beta2": 0.99}),
        # heavyball's shift in the QR step alone: the detail the heavyball_details study found moving soap's mean most
        "soap_muon_qr_shift": ("SOAP-Muon, the shifted QR step (refresh PowerQR(lift=1e-8))", None,
                               {**SOAP_MUON, "refresh": PowerQR(lift=1e-8)}),
        # NorMuon's rows after the polar factor: the step past Muon that the campaign's NorMuon arm measures alone
        "soap_muon_neuron_norm": ("SOAP-Muon, NorMuon's row normalization (neuron_norm_beta2 0.95)", None,
                                  {**SOAP_MUON, "neuron_norm_beta2": 0.95}),
    }),
    # the spec decides which coordinates form a block: c_attn as one 3 d x d matrix (gpt_muon, as published Muon
    # runs treat it) or its query, key and value rows as three d x d matrices (gpt_muon_qkv), each with its own
    # polar factor and, under SOAP-Muon, its own two Kronecker sides
    "qkv": Study("SOAP-Muon's blocks: c_attn as one matrix or as its query, key and value", 0.02, 0.1, {
        "soap_muon": ("SOAP-Muon, gpt_muon (c_attn one matrix)", "symo_soap_muon_gpt_muon", SOAP_MUON),
        "soap_muon_qkv": ("SOAP-Muon, gpt_muon_qkv (q, k, v three matrices)", None, SOAP_MUON),
    }, specs={"soap_muon_qkv": "gpt_muon_qkv"}),
    # the same split under Muon's own step (Symo's defaults at their tuned rate and decay): whether what the split
    # does is SOAP's or any polar step's
    "qkv_muon": Study("Muon's step's blocks: c_attn as one matrix or as its query, key and value", 0.02, 0.1, {
        "muon_step": ("Muon's step (Symo's defaults), gpt_muon", "symo_defaults_gpt_muon", {"update_scale": "muon"}),
        "muon_step_qkv": ("Muon's step (Symo's defaults), gpt_muon_qkv", None, {"update_scale": "muon"}),
    }, specs={"muon_step_qkv": "gpt_muon_qkv"}),
    # how often SOAP-Muon's two Kronecker bases are refreshed, on the default spec: heavyball's every 2 steps was
    # worth 0.008 to `soap` (the first study); the campaign's heavyball-refresh SOAP-Muon arm changed four details at
    # once, so this asks the refresh period alone
    "qkv_refresh": Study("SOAP-Muon on gpt_muon_qkv: how often the bases are refreshed", 0.02, 0.1, {
        "soap_muon_qkv": ("SOAP-Muon, gpt_muon_qkv, refresh every 10 steps (the preset)", None, SOAP_MUON),
        "soap_muon_qkv_refresh_5": ("SOAP-Muon, gpt_muon_qkv, refresh every 5 steps", None,
                                    {**SOAP_MUON, "precondition_frequency": 5}),
        "soap_muon_qkv_refresh_2": ("SOAP-Muon, gpt_muon_qkv, refresh every 2 steps", None,
                                    {**SOAP_MUON, "precondition_frequency": 2}),
    }, spec="gpt_muon_qkv"),
    # the decay grid's edge: at 0.26x Chinchilla SOAP-Muon on gpt_muon_qkv and heavyball's SOAP both chose 0.1, the
    # largest decay of the campaign's grid {0, 0.05, 0.1} (SOAP-Muon's seed-0 losses fall across it: 1.5222, 1.5184,
    # 1.5067), while Muon's choice, 0.05, is inside; the campaign extends a rate grid at its edge, not the decay's
    # with the decay symo train defaults to (0.05, its tuned choice at 2x Chinchilla): the default step's figure here
    "decay_soap_muon": Study("SOAP-Muon on gpt_muon_qkv: a decay past the grid's edge, and symo train's default decay",
                             0.02, 0.1, {
        "soap_muon_qkv": ("SOAP-Muon, gpt_muon_qkv, decay 0.1 (its tuned, the grid's largest)", None, SOAP_MUON),
        "soap_muon_qkv_wd_0.2": ("SOAP-Muon, gpt_muon_qkv, decay 0.2", None, SOAP_MUON),
        "soap_muon_qkv_wd_0.05": ("SOAP-Muon, gpt_muon_qkv, decay 0.05 (symo train's default)", None, SOAP_MUON),
    }, spec="gpt_muon_qkv", wds={"soap_muon_qkv_wd_0.2": 0.2, "soap_muon_qkv_wd_0.05": 0.05}),
    "decay_heavyball": Study("heavyball's SOAP: a decay past the grid's edge", 6e-3, 0.1, {
        "heavyball_soap": ("SOAP (heavyball), decay 0.1 (its tuned, the grid's largest)", "soap", None),
        "heavyball_soap_wd_0.2": ("SOAP (heavyball), decay 0.2", "soap", None),
    }, wds={"heavyball_soap_wd_0.2": 0.2}),
    # what two of SOAP-Muon's details are worth on gpt_muon_qkv: the exact polar factor (by eigh, as
    # Symo's Auto takes it for sides up to 128, where the Muon arm runs Muon's quintic Newton-Schulz), and the second
    # Kronecker side (two_sided=False rotates only the input side, W's columns: one-sided SOAP's basis)
    "qkv_polar_sides": Study("SOAP-Muon on gpt_muon_qkv: Muon's inexact polar factor, and one Kronecker side", 0.02,
                             0.1, {
        "soap_muon_qkv": ("SOAP-Muon, gpt_muon_qkv (exact polar factor, both sides: the preset)", None, SOAP_MUON),
        "soap_muon_qkv_ns": ("SOAP-Muon, gpt_muon_qkv, polar by Muon's quintic Newton-Schulz (5 steps, float32)",
                             None, {**SOAP_MUON, "backend": NewtonSchulz()}),
        "soap_muon_qkv_one_sided": ("SOAP-Muon, gpt_muon_qkv, one side rotated (two_sided=False)", None,
                                    {**SOAP_MUON, "two_sided": False}),
    }, spec="gpt_muon_qkv"),
    # the SOAP authors' own SOAP-Muon code takes the signed square root of the polar factor's coordinates in SOAP's
    # eigenbasis (then rescales to the polar factor's norm): a step from the polar factor towards the sign of the
    # eigenbasis coordinates
    "qkv_signed_root": Study("SOAP-Muon on gpt_muon_qkv: the SOAP authors' signed square root in the eigenbasis", 0.02,
                             0.1, {
        "soap_muon_qkv": ("SOAP-Muon, gpt_muon_qkv (the polar factor: the preset)", None, SOAP_MUON),
        "soap_muon_qkv_root": ("SOAP-Muon, gpt_muon_qkv, signed square root in the eigenbasis (eigenbasis_power 0.5)",
                               None, {**SOAP_MUON, "eigenbasis_power": 0.5}),
    }, spec="gpt_muon_qkv"),
    # what SOAP's rotation is worth to SOAP-Muon: without it (no side rotated) the step is Adam's second moment in the
    # weights' own coordinates, then the polar factor (rotating the momentum alone would change nothing: the polar
    # factor commutes with rotations); and the 512-wide sides of the MLP's matrices, whose statistics and QR refreshes
    # are the step's largest, left unrotated
    "qkv_rotation": Study("SOAP-Muon on gpt_muon_qkv: what the eigenbasis rotation is worth", 0.02, 0.1, {
        "soap_muon_qkv": ("SOAP-Muon, gpt_muon_qkv (every side rotated: the preset)", None, SOAP_MUON),
        "soap_muon_qkv_unrotated": ("SOAP-Muon, gpt_muon_qkv, no side rotated (max_precond_dim 1)", None,
                                    {**SOAP_MUON, "max_precond_dim": 1}),
        "soap_muon_qkv_max_128": ("SOAP-Muon, gpt_muon_qkv, 512-wide sides unrotated (max_precond_dim 128)", None,
                                  {**SOAP_MUON, "max_precond_dim": 128}),
    }, spec="gpt_muon_qkv"),
    # one polar factor over each MLP's two matrices (gpt_muon_qkv_mlp) under Muon's own step, which keeps no
    # statistics: how much of the coupling's cost to SOAP-Muon is the joint polar factor's
    "mlp_coupling_muon": Study("Muon's step with each MLP one block through its hidden units", 0.02, 0.1, {
        "muon_step_qkv": ("Muon's step (Symo's defaults), gpt_muon_qkv", None, {"update_scale": "muon"}),
        "muon_step_qkv_mlp": ("Muon's step (Symo's defaults), gpt_muon_qkv_mlp (each MLP one block)", None,
                              {"update_scale": "muon"}),
    }, spec="gpt_muon_qkv", specs={"muon_step_qkv_mlp": "gpt_muon_qkv_mlp"}),
    # the campaign's gpt_true SOAP-Muon arm moved each block at Muon's per-block factor alone (parameter_rms=False);
    # Symo's default rescales each parameter to Muon's per-shape RMS, so that the rate of a Muon-style spec serves
    "true_rms": Study("SOAP-Muon on gpt_true: the per-parameter RMS (Symo's default)", 0.02, 0.1, {
        "soap_muon_true": ("SOAP-Muon, gpt_true, Muon's per-block factor alone (parameter_rms=False: the campaign arm)",
                           "symo_soap_muon_gpt_true", {**SOAP_MUON, "parameter_rms": False}),
        "soap_muon_true_rms": ("SOAP-Muon, gpt_true, the per-parameter RMS (parameter_rms=True, the default)", None,
                               SOAP_MUON),
    }, spec="gpt_true"),
    # gpt_true's attention with gpt_muon_qkv's MLP: the per-head gauges alone, beside the campaign's gpt_muon_qkv_mlp
    # arm (the MLP's coupling alone)
    "true_attention": Study("SOAP-Muon with the true symmetry's per-head attention gauges alone", 0.02, 0.1, {
        "soap_muon_qkv_arm": ("SOAP-Muon, gpt_muon_qkv (the campaign arm)", "symo_soap_muon_gpt_muon_qkv", SOAP_MUON),
        "soap_muon_true_attention": ("SOAP-Muon, gpt_true's attention with gpt_muon_qkv's MLP", None, SOAP_MUON),
    }, spec="gpt_muon_qkv", specs={"soap_muon_true_attention": "benchmarks/specs/gpt_true_attention.toml"}),
    # gpt_muon_qkv_mlp with gpt_true's MLP (plain perms, c_fc's bias covered): the last of gpt_true's parts that no
    # run had measured alone, beside the campaign's coupled arm
    "true_mlp": Study("SOAP-Muon with the true symmetry's MLP beside the coupling alone", 0.02, 0.1, {
        "soap_muon_qkv_mlp_arm": ("SOAP-Muon, gpt_muon_qkv_mlp (the campaign arm: signed perms, bias to AdamW)",
                                  "symo_soap_muon_gpt_muon_qkv_mlp", SOAP_MUON),
        "soap_muon_true_mlp": ("SOAP-Muon, gpt_true's MLP (plain perms, the mean block, c_fc's bias covered)", None,
                               SOAP_MUON),
    }, spec="gpt_muon_qkv_mlp", specs={"soap_muon_true_mlp": "benchmarks/specs/gpt_true_mlp.toml"}),
    "heavyball_details": Study("Which of heavyball's details carries the rest", 6e-3, 0.0, {
        "soap_both_defaults": ("soap with heavyball's defaults (beta1 0.9, refresh every 2)", None,
                               {"preset": "soap", "beta1": 0.9, "precondition_frequency": 2}),
        "soap_hb_phase": ("+ the refresh one step earlier (refresh_phase heavyball)", None,
                          {"preset": "soap", "beta1": 0.9, "precondition_frequency": 2, "refresh_phase": "heavyball"}),
        "soap_hb_clamp": ("+ eps as a clamp (eps_placement clamp)", None,
                          {"preset": "soap", "beta1": 0.9, "precondition_frequency": 2, "eps_placement": "clamp"}),
        "soap_hb_qr_shift": ("+ the shifted QR step (refresh PowerQR(lift=1e-8))", None,
                             {"preset": "soap", "beta1": 0.9, "precondition_frequency": 2,
                              "refresh": PowerQR(lift=1e-8)}),
        "soap_heavyball": ("soap_heavyball (all three)", "symo_soap_heavyball_gpt_muon", {"preset": "soap_heavyball"}),
    }),
}
