"""SOAP's conventions and settings, one change at a time, on the nanoGPT reference regime.

Eleven studies, each at its preset's tuned rate and decay on the gpt_muon spec (unless the study or a variant names
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
  (heavyball's SOAP as the campaign builds it).
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
- `heavyball_details`: which of heavyball's three details carries the rest of the first study's gap. From `soap`
  with heavyball's two defaults, it adds one detail at a time; its last row, `soap_heavyball`, has all three.

    python -m benchmarks.soap_gap              # 80 runs of 6-10 minutes on 2 workers (about 7 h)
    python -m benchmarks.soap_gap --report     # train nothing: the report of what the run cache holds

Runs the campaign already made (the soap and soap_muon studies' bases, `soap_heavyball`'s seed 0, heavyball's SOAP
at its tuned decay) are read from its run cache; a variant two studies name is one run; new runs go to
benchmarks/results/soap_gap_runs.json. Writes soap_gap.{md,json,png}.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness import RunCache, mean_std, paired_diff_ci95, write_results
from benchmarks.nanogpt_matrix_report import mean_curve, steps_to
from benchmarks.nanogpt_matrix_runs import (
    REGIMES,
    RESULTS,
    SOAP_MUON,
    follow_up_args,
    job_for,
    runs_beside_the_campaign,
)
from symo.optim import NewtonSchulz, PowerQR

NAME = "soap_gap"
REGIME, SEEDS = "reference", (0, 1, 2)
# a variant that also runs seeds 3-5, paired with Muon's seeds 3-5 from benchmarks/soap_seeds.py's run cache and with
# its base's (from there too where the base is a campaign arm): the 0.85x goal is about figures that move by 0.1x
# between three-seed subsets
SIX_SEEDS, EXTRA_SEEDS = {"soap_muon": "soap_muon_neuron_norm", "qkv": "soap_muon_qkv",
                           "qkv_polar_sides": "soap_muon_qkv_one_sided", "qkv_rotation": "soap_muon_qkv_unrotated"
                           }, (3, 4, 5)


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
    "decay_soap_muon": Study("SOAP-Muon on gpt_muon_qkv: a decay past the grid's edge", 0.02, 0.1, {
        "soap_muon_qkv": ("SOAP-Muon, gpt_muon_qkv, decay 0.1 (its tuned, the grid's largest)", None, SOAP_MUON),
        "soap_muon_qkv_wd_0.2": ("SOAP-Muon, gpt_muon_qkv, decay 0.2", None, SOAP_MUON),
    }, spec="gpt_muon_qkv", wds={"soap_muon_qkv_wd_0.2": 0.2}),
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


def jobs(campaign: RunCache) -> list[dict]:
    """Every study's runs; a run the campaign made carries the campaign's key (read from its cache)."""
    setup, out = REGIMES[REGIME], []
    for study_name, study in STUDIES.items():
        for variant, (label, arm, options) in study.variants.items():
            wd = study.wds.get(variant, study.wd)
            for seed in SEEDS + (EXTRA_SEEDS if six_seeded(study_name, variant) else ()):
                job = job_for(REGIME, setup, arm, study.lr, wd, seed) if arm else None
                if options is not None and (job is None or job["key"] not in campaign):
                    job = job_for(REGIME, setup, f"soap_gap_{variant}", study.lr, wd, seed)
                    job["arm_config"] = {"kind": "symo", "spec": study.specs.get(variant, study.spec),
                                         "options": options, "label": label}
                job["study"], job["variant"] = study_name, variant
                out.append(job)
    return out


def summarize(study: Study, records: dict[str, list[dict]], muon_final: float | None,
              muon_steps: int | None = None) -> tuple[dict, str]:
    """Per variant of `study`: the final losses, the paired interval against the study's base, and the steps its
    seed-mean curve takes to Muon's mean final loss (with `muon_steps`, Muon's own, also their ratio, as the
    campaign reports it)."""
    records = {v: [r for r in runs if r["seed"] in SEEDS] for v, runs in records.items()}
    base = {r["seed"]: r["final_val"] for r in records[study.base]}
    rows, data = [], {}
    for variant, runs in records.items():
        label = study.variants[variant][0]
        if len(runs) < len(SEEDS) or len(base) < len(SEEDS):
            rows.append(f"| {label} | {len(runs)} of {len(SEEDS)} seeds | | |")
            continue
        finals = {r["seed"]: r["final_val"] for r in runs}
        m, s = mean_std(finals.values())
        lo, hi = paired_diff_ci95([finals[k] for k in SEEDS], [base[k] for k in SEEDS])
        reach = steps_to(mean_curve(runs), muon_final) if muon_final is not None else None
        ratio = reach / muon_steps if reach is not None and muon_steps else None
        data[variant] = {"label": label, "final_val_mean": m, "final_val_std": s, "finals": finals,
                         "diff_to_base_ci95": [lo, hi], "steps_to_muon_final": reach,
                         "steps_to_muon_final_ratio": ratio}
        interval = "" if variant == study.base else f"[{lo:+.4f}, {hi:+.4f}]"
        steps = "not reached" if reach is None else f"{reach}" + (f" ({ratio:.2f}x)" if ratio is not None else "")
        rows.append(f"| {label} | {m:.4f} ± {s:.4f} | {interval} | {steps} |")
    table = [f"| variant | final val (3 seeds) | diff to {study.base}, paired 95% | steps to Muon's final loss "
             "(vs Muon's) |", "|---|---|---|---|", *rows]
    return data, "\n".join(table)


def six_seeds(study: Study, variant: str, records: dict[str, list[dict]], seeds_cache: RunCache,
              muon: dict[int, dict]) -> tuple[dict, str] | None:
    """`variant` against its study's base and Muon over seeds 0-5 (Muon's seeds 3-5 from soap_seeds' run cache, and
    the base's where it is a campaign arm; else they are in `records`, run here): final losses, paired intervals,
    and the steps each seed-mean curve takes to Muon's six-seed mean final loss as a ratio of Muon's own (the
    campaign's `Muon-loss steps`, on six seeds). None until every run is there."""
    seeds = SEEDS + EXTRA_SEEDS
    arm = study.variants[study.base][1]
    base = {r["seed"]: r for r in records[study.base]}
    if arm is not None:
        base |= {s: seeds_cache[k] for s in EXTRA_SEEDS
                 if (k := job_for(REGIME, REGIMES[REGIME], arm, study.lr, study.wd, s)["key"]) in seeds_cache}
    runs = {"muon": muon, study.base: base, variant: {r["seed"]: r for r in records[variant]}}
    labels = {"muon": "Muon", study.base: study.variants[study.base][0], variant: study.variants[variant][0]}
    if any(set(by_seed) != set(seeds) for by_seed in runs.values()):
        return None
    muon_final = mean_std(muon[s]["final_val"] for s in seeds)[0]
    muon_steps = steps_to(mean_curve(list(muon.values())), muon_final)
    rows, data = [], {}
    for name, by_seed in runs.items():
        finals = [by_seed[s]["final_val"] for s in seeds]
        m, sd = mean_std(finals)
        reach = steps_to(mean_curve(list(by_seed.values())), muon_final)
        intervals = [paired_diff_ci95(finals, [other[s]["final_val"] for s in seeds])
                     for other in (muon, base)]
        data[name] = {"label": labels[name], "final_val_mean": m, "final_val_std": sd,
                      "diff_to_muon_ci95": list(intervals[0]), "diff_to_base_ci95": list(intervals[1]),
                      "muon_loss_steps_ratio": None if reach is None else reach / muon_steps}
        cells = ["" if other is by_seed else f"[{lo:+.4f}, {hi:+.4f}]"
                 for other, (lo, hi) in zip((muon, base), intervals)]
        steps = "not reached" if reach is None else f"{reach / muon_steps:.2f}x"
        rows.append(f"| {labels[name]} | {m:.4f} ± {sd:.4f} | {cells[0]} | {cells[1]} | {steps} |")
    from_seeds = "of the base and of Muon" if arm is not None else "of Muon"
    table = [f"Six seeds ({', '.join(map(str, seeds))}; seeds 3-5 {from_seeds} from "
             f"benchmarks/soap_seeds.py's runs; Muon's six-seed mean final loss {muon_final:.4f}):", "",
             f"| arm | final val (6 seeds) | diff to Muon, 95% | diff to {study.base}, 95% | Muon-loss steps |",
             "|---|---|---|---|---|", *rows]
    return data, "\n".join(table)


def plot(out: Path, records: dict[str, dict[str, list[dict]]], muon_final: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 3
    rows = -(-len(STUDIES) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 4 * rows), squeeze=False)
    for ax in axes.flat[len(STUDIES):]:
        ax.set_visible(False)
    for ax, (study_name, study) in zip(axes.flat, STUDIES.items()):
        for variant, runs in records[study_name].items():
            runs = [r for r in runs if r["seed"] in SEEDS]  # the curves of the three-seed tables
            if len(runs) == len(SEEDS):
                steps, vals = zip(*mean_curve(runs))
                ax.plot(steps, vals, label=study.variants[variant][0])
        if muon_final is not None:
            ax.axhline(muon_final, color="grey", linestyle=":", label="Muon's mean final loss")
        ax.set(xlabel="step", ylabel="validation loss (mean of 3 seeds)", ylim=(1.5, 1.9),
               title=f"{study_name}: lr {study.lr:g}, weight decay {study.wd:g}")
        ax.legend(fontsize=7)
    fig.suptitle(f"nanoGPT {REGIME} regime")
    fig.tight_layout(rect=(0, 0, 1, 0.98))  # room for the suptitle
    fig.savefig(out / f"{NAME}.png", dpi=120)
    plt.close(fig)


def muon_runs(campaign: RunCache, seeds_cache: RunCache) -> dict[int, dict]:
    """Muon's runs at its tuned rate and decay by seed: 0-2 from the campaign's cache, 3-5 from soap_seeds'."""
    muon = json.loads((RESULTS / "nanogpt_matrix.json").read_text())[REGIME]["arms"]["muon"]
    keys = {s: job_for(REGIME, REGIMES[REGIME], "muon", muon["lr"], muon["weight_decay"], s)["key"]
            for s in SEEDS + EXTRA_SEEDS}
    return {s: (campaign if s in SEEDS else seeds_cache)[k] for s, k in keys.items()
            if k in (campaign if s in SEEDS else seeds_cache)}


def muon_reference(campaign: RunCache) -> tuple[float | None, int | None]:
    """Muon's tuned mean final loss (the campaign's report) and the steps its seed-mean curve takes to it (its runs
    from the campaign's cache)."""
    report = RESULTS / "nanogpt_matrix.json"
    tuned = json.loads(report.read_text())[REGIME] if report.is_file() else {}
    muon_final, muon = tuned.get("muon_final"), tuned.get("arms", {}).get("muon")
    if muon_final is None or muon is None:
        return muon_final, None
    keys = [job_for(REGIME, REGIMES[REGIME], "muon", muon["lr"], muon["weight_decay"], seed)["key"] for seed in SEEDS]
    if not all(k in campaign for k in keys):
        return muon_final, None
    return muon_final, steps_to(mean_curve([campaign[k] for k in keys]), muon_final)


def main(argv: list[str] | None = None) -> int:
    args = follow_up_args(__doc__.splitlines()[0], argv)
    campaign = RunCache(RESULTS / f"nanogpt_matrix_{REGIME}_runs.json")
    todo = jobs(campaign)
    found = runs_beside_the_campaign(todo, RunCache(args.out / f"{NAME}_runs.json"), args.workers, not args.report,
                                     NAME)
    records = {name: {v: [] for v in study.variants} for name, study in STUDIES.items()}
    for job in todo:
        if job["key"] in found:
            records[job["study"]][job["variant"]].append(found[job["key"]])
    muon_final, muon_steps = muon_reference(campaign)
    n_runs = len({job["key"] for job in todo if job["key"] in found})  # a run two studies share counts once
    md = [
        "# SOAP's conventions and settings on nanoGPT, one change at a time",
        "",
        f"Command: `python -m benchmarks.soap_gap` ({n_runs} runs; the soap and soap_muon studies' base "
        "runs, soap_heavyball's seed 0 and heavyball's SOAP at its tuned decay come from the campaign's run cache)",
        "",
        f"The nanoGPT campaign's {REGIME} regime (benchmarks/nanogpt_matrix.py), the gpt_muon spec unless a row "
        f"names another, seeds {', '.join(map(str, SEEDS))}; each variant changes what its row says and nothing "
        "else. `diff to base` is the paired 95% interval of (variant - base) final validation loss (negative: "
        "better). Steps to Muon's final loss: the seed-mean curve's first evaluation at or below Muon's tuned mean "
        "final loss"
        + (f" ({muon_final:.4f})" if muon_final is not None else "")
        + (f", and as a ratio of the {muon_steps} steps Muon's own seed-mean curve takes (the campaign's "
           "`Muon-loss steps`)." if muon_steps else "."),
    ]
    data = {}
    seeds_cache = RunCache(RESULTS / "soap_seeds_runs.json")
    for name, study in STUDIES.items():
        study_data, table = summarize(study, records[name], muon_final, muon_steps)
        data[name] = {"lr": study.lr, "wd": study.wd, "base": study.base, "variants": study_data}
        md += ["", f"## {study.title} (`{study.base}` at lr {study.lr:g}, weight decay {study.wd:g})", "", table]
        if name in SIX_SEEDS:
            six = six_seeds(study, SIX_SEEDS[name], records[name], seeds_cache, muon_runs(campaign, seeds_cache))
            if six is not None:
                data[name]["six_seeds"] = six[0]
                md += ["", six[1]]
    md = "\n".join(md) + "\n"
    write_results(args.out, NAME, md, {"regime": REGIME, "seeds": list(SEEDS), "muon_final_val_mean": muon_final,
                                       "muon_steps_to_its_final": muon_steps, "studies": data})
    plot(args.out, records, muon_final)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
