"""The nanoGPT campaign's report: the screening table, each tuned regime's table (final loss, paired interval
to Muon, steps to the target and to Muon's final loss, time per step), a progress table for unfinished arms,
and the validation curves."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from benchmarks.harness import mean_std, paired_diff_ci95
from benchmarks.nanogpt_matrix_runs import ARMS, NAME, REGIMES, TUNED_REGIMES
from benchmarks.nanogpt_matrix_schedule import WEIGHT_DECAYS, Tuning, screened_out

PROTOCOL_NOTES = (
    "Protocol: per arm and regime, a 3-point learning-rate grid (seed 0, no weight decay, full-length runs, "
    "extended at an edge so every chosen rate is inside its grid), then weight decay from {0, 0.05, 0.1} at the "
    "chosen rate, then seeds 1 and 2 at the chosen pair. Seeds share initialization and batches across arms. "
    "Muon, SOAP, PSGD-Kron, NorMuon and Symo update the hidden matrices; embeddings, LayerNorm gains and biases "
    "go to AdamW at 3e-3 in each. SOAP and PSGD-Kron: heavyball, documented defaults apart from rate and decay, "
    "torch.compile off; the authors' SOAP and NorMuon: pytorch-optimizer, likewise (NorMuon's Newton-Schulz in "
    "float32, as Muon's). Target = the worst AdamW seed's final validation loss. `Muon-loss steps` = steps the "
    "arm's seed-mean validation curve takes to reach Muon's mean final loss, as a ratio of the steps Muon's own "
    "seed-mean curve takes (evaluations every 20 steps; the figure the public speed records use). "
    "`diff to Muon` = paired 95% interval of (arm - Muon) final loss over the 3 seeds (negative: better than "
    "Muon). `time/step vs AdamW` = mean ms per step over 5 interleaved 10-step rounds after a warm-up round, in "
    "one process with one thread on an idle machine (a mean, so that preconditioner refreshes count).",
)





def steps_to(evals: list, target: float) -> int | None:
    return next((int(s) for s, v in evals if v <= target), None)


def mean_curve(runs: list[dict]) -> list[tuple[int, float]]:
    """The seeds' mean validation curve, at the evaluation steps they share."""
    curves = [dict(r["evals"]) for r in runs]
    shared = sorted(set.intersection(*(set(c) for c in curves)))
    return [(s, statistics.mean(c[s] for c in curves)) for s in shared]


def non_embedding_params(setup: dict) -> int:
    """Parameters apart from the token and position embeddings (the Chinchilla count)."""
    d, n = setup["n_embd"], setup["n_layer"]
    return n * (12 * d * d + 13 * d) + 2 * d


def progress_section(regime: str, unfinished: dict[str, Tuning]) -> tuple[dict, str]:
    """Arms not in a regime table yet (their protocol, or AdamW's or Muon's, is unfinished): stage and seed-0 runs."""
    def stage(t: Tuning) -> str:
        if t.finished():
            return f"finished at lr {t.lr:g}, wd {t.wd:g} ({len(t.runs)} seed{'s' * (len(t.runs) > 1)})"
        if t.lr is None:
            return f"rate grid, {len(t.rates)} of {len(t.grid)} runs"
        if t.wd is None:
            return f"weight decay at lr {t.lr:g}, {len(t.decays)} of {len(WEIGHT_DECAYS)}"
        return f"seeds at lr {t.lr:g}, wd {t.wd:g}: {len(t.runs)} of {t.n_seeds}"

    data = {a: {"stage": stage(t), "lr": t.lr, "weight_decay": t.wd,
                "grid": {f"{lr:g}": v for lr, v in sorted(t.rates.items())},
                "decays": {f"{wd:g}": v for wd, v in sorted(t.decays.items())},
                "val_finals": [r["final_val"] for r in t.seed_runs()]} for a, t in unfinished.items()}
    lines = [f"## {regime}: in progress (seed-0 runs so far; a result once the arm's protocol, AdamW's and Muon's "
             "have finished)", "",
             "| arm | stage | best seed-0 final val so far | lr: final val | wd: final val |", "|---|---|---|---|---|"]
    for a, t in sorted(unfinished.items(), key=lambda kv: min(kv[1].rates.values(), default=math.inf)):
        best = min([*t.rates.values(), *t.decays.values()], default=None)
        rates = ", ".join(f"{lr:g}: {v:.4f}" for lr, v in sorted(t.rates.items())) or "-"
        decays = ", ".join(f"{wd:g}: {v:.4f}" for wd, v in sorted(t.decays.items())) or "-"
        lines.append(f"| {ARMS[a]['label']} | {stage(t)} | {'-' if best is None else f'{best:.4f}'} | {rates} "
                     f"| {decays} |")
    return data, "\n".join(lines) + "\n"


def screen_section(tunings: dict[tuple[str, str], Tuning]) -> tuple[dict, str] | None:
    """The screening pass's table: each arm's rate grid at the small size, and whether it was dropped."""
    rows = {a: t for (r, a), t in tunings.items() if r == "screen" and t.lr is not None}
    muon = tunings.get(("screen", "muon"))
    if not rows or muon is None or not muon.finished():
        return None
    m, s = mean_std(r["final_val"] for r in muon.seed_runs())
    dropped = screened_out(tunings)
    data = {"setup": REGIMES["screen"], "muon_mean": m, "muon_std": s, "dropped": dropped,
            "arms": {a: {"lr": t.lr, "best": t.rates[t.lr],
                         "grid": {f"{lr:g}": v for lr, v in sorted(t.rates.items())}} for a, t in rows.items()}}
    lines = ["## Screening pass: the reference model at batch 16 x context 64, 500 steps (seed 0)", "",
             f"Muon: {m:.4f} ± {s:.4f} over {muon.n_seeds} seeds at its chosen rate. An arm whose best grid loss is "
             f"worse than Muon's mean by more than two of Muon's seed spreads ({m + 2 * s:.4f}) is dropped from the "
             "reference regime (it still runs in the data-rich regime).", "",
             "| arm | best lr | best final val (seed 0) | grid (lr: final val) | reference regime |",
             "|---|---|---|---|---|"]
    for a, t in sorted(rows.items(), key=lambda kv: kv[1].rates[kv[1].lr]):
        grid = ", ".join(f"{lr:g}: {v:.4f}" for lr, v in sorted(t.rates.items()))
        lines.append(f"| {ARMS[a]['label']} | {t.lr:g} | {t.rates[t.lr]:.4f} | {grid} | "
                     f"{'dropped: ' + dropped[a] if a in dropped else 'kept'} |")
    return data, "\n".join(lines) + "\n"


def summarize(regime: str, setup: dict, ready: dict[str, Tuning], ms: dict[str, float],
              dropped: dict[str, str] | None = None) -> tuple[dict, str]:
    """A tuned regime's table and JSON entry from its finished arms; `dropped` are the arms the screening pass
    kept out of it (arm -> why), listed below the table."""
    dropped = dropped or {}
    runs = {a: t.seed_runs() for a, t in ready.items()}
    target = max(r["final_val"] for r in runs["adamw"])
    muon_final = statistics.mean(r["final_val"] for r in runs["muon"])

    def mean_steps(rs: list[dict], level: float) -> float | None:
        s = [steps_to(r["evals"], level) for r in rs]
        return None if any(x is None for x in s) else statistics.mean(s)

    # on the seeds' mean curve: a seed that ends above the mean would never reach it on its own
    muon_steps = steps_to(mean_curve(runs["muon"]), muon_final)
    arms = {}
    for a, t in ready.items():
        finals = [r["final_val"] for r in runs[a]]
        m, s = mean_std(finals)
        to_muon = steps_to(mean_curve(runs[a]), muon_final)
        arms[a] = {"lr": t.lr, "weight_decay": t.wd, "grid": {f"{lr:g}": v for lr, v in sorted(t.rates.items())},
                   "decays": {f"{wd:g}": v for wd, v in sorted(t.decays.items())}, "val_finals": finals,
                   "mean": m, "std": s,
                   "diff_to_muon_ci95": list(paired_diff_ci95(finals, [r["final_val"] for r in runs["muon"]])),
                   "steps_to_target_mean": mean_steps(runs[a], target),
                   "steps_to_muon_final_ratio": (to_muon / muon_steps) if to_muon and muon_steps else None,
                   "ms_per_step_vs_adamw": (ms[a] / ms["adamw"]) if a in ms and "adamw" in ms else None}
    n = non_embedding_params(setup)
    tokens = setup["batch_size"] * setup["block_size"] * setup["steps"]
    data = {"setup": {**setup, "non_embedding_params": n, "tokens": tokens,
                      "chinchilla_ratio": tokens / (20 * n)}, "target": target, "muon_final": muon_final, "arms": arms,
            "dropped_by_screen": dropped}
    lines = [f"## {regime}: GPT {setup['n_layer']}x{setup['n_embd']} ({setup['n_head']} heads), batch "
             f"{setup['batch_size']}x{setup['block_size']}, {setup['steps']} steps: {tokens / 1e6:.1f}M tokens for "
             f"{n / 1e6:.2f}M non-embedding parameters ({tokens / (20 * n):.2f}x Chinchilla)", "",
             f"Target {target:.4f} (worst AdamW seed); Muon's mean final loss {muon_final:.4f}.", "",
             f"| arm | lr | wd | final val ({len(runs['muon'])} seeds) | diff to Muon, 95% | steps to target "
             "| Muon-loss steps vs Muon "
             "| time/step vs AdamW |", "|---|---|---|---|---|---|---|---|"]
    for a, s in sorted(arms.items(), key=lambda kv: kv[1]["mean"]):
        lo, hi = s["diff_to_muon_ci95"]
        ci = "-" if a == "muon" else f"[{lo:+.4f}, {hi:+.4f}]"
        st = "-" if s["steps_to_target_mean"] is None else f"{s['steps_to_target_mean']:.0f}"
        ratio = "not reached" if s["steps_to_muon_final_ratio"] is None else f"{s['steps_to_muon_final_ratio']:.2f}x"
        tm = "-" if s["ms_per_step_vs_adamw"] is None else f"{s['ms_per_step_vs_adamw']:.2f}x"
        lines.append(f"| {ARMS[a]['label']} | {s['lr']:g} | {s['weight_decay']:g} | {s['mean']:.4f} ± {s['std']:.4f} "
                     f"| {ci} | {st} | {ratio} | {tm} |")
    soap_family = [a for a in arms if a != "soap" and "soap" in a]
    if "soap" in arms and soap_family:
        # the SOAP arms against the best-kept SOAP implementation in the campaign, heavyball's, seed by seed
        lines += ["", "SOAP arms against heavyball's SOAP (paired 95% interval of (arm - heavyball SOAP) final loss; "
                  "negative: better than heavyball's):", "", "| arm | diff to heavyball SOAP, 95% |", "|---|---|"]
        for a in sorted(soap_family, key=lambda a: arms[a]["mean"]):
            lo, hi = paired_diff_ci95(arms[a]["val_finals"], arms["soap"]["val_finals"])
            arms[a]["diff_to_heavyball_soap_ci95"] = [lo, hi]
            lines.append(f"| {ARMS[a]['label']} | [{lo:+.4f}, {hi:+.4f}] |")
    if dropped:
        lines += ["", "Not trained here, dropped by the screening pass (best seed-0 loss there against Muon's mean + 2 "
                  "seed spreads): " + "; ".join(f"{ARMS[a]['label']} ({why})" for a, why in sorted(dropped.items()))
                  + "."]
    lines += ["", "Grids (seed 0; learning rate at decay 0, then decay at the chosen rate; * = chosen):", "",
              "| arm | lr: final val | wd: final val |", "|---|---|---|"]
    for a, t in ready.items():
        rates = ", ".join(f"{lr:g}{'*' if lr == t.lr else ''}: {v:.4f}" for lr, v in sorted(t.rates.items()))
        decays = ", ".join(f"{wd:g}{'*' if wd == t.wd else ''}: {v:.4f}" for wd, v in sorted(t.decays.items()))
        lines.append(f"| {ARMS[a]['label']} | {rates} | {decays} |")
    return data, "\n".join(lines) + "\n"


def plot(out: Path, data: dict, tunings: dict) -> None:
    """Validation curves per tuned regime: each finished arm's mean over seeds, or, while a regime is still in
    progress, each arm's best seed-0 run so far (dashed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    panels = [r for r in TUNED_REGIMES if r in data or f"{r}_progress" in data]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 4.8), squeeze=False)
    for ax, regime in zip(axes[0], panels):
        d = data.get(regime, {"arms": {}})
        curves = []  # (label, steps, losses, final, dashed)
        for a in d["arms"]:
            rs = tunings[(regime, a)].seed_runs()
            steps = [s for s, _ in rs[0]["evals"]]
            mean = [statistics.mean(dict(r["evals"]).get(s, math.nan) for r in rs) for s in steps]
            final = d["arms"][a]["mean"]
            curves.append((f"{ARMS[a]['label']} ({final:.3f})", steps, mean, final, False))
        for a in data.get(f"{regime}_progress", {}):
            seed0 = tunings[(regime, a)].seed0
            if seed0:
                best = min(seed0.values(), key=lambda r: r["final_val"])
                steps, losses = zip(*best["evals"])
                curves.append((f"{ARMS[a]['label']} (seed 0 so far, {best['final_val']:.3f})", steps, losses,
                               best["final_val"], True))
        if not curves:
            continue
        ax.set_prop_cycle(color=plt.cm.tab20.colors[::2] + plt.cm.tab20.colors[1::2])  # 20 distinct colours
        for label, steps, losses, _, dashed in sorted(curves, key=lambda c: c[3]):
            ax.plot(steps, losses, label=label, lw=1.2, ls="--" if dashed else "-")
        floor = min(c[3] for c in curves)
        if "muon_final" in d:
            ax.axhline(d["muon_final"], color="gray", ls=":", lw=0.8, label="Muon's final loss")
        ax.set_ylim(floor - 0.1, floor + 0.7)
        ratio = (d.get("setup") or {}).get("chinchilla_ratio")
        title = f"{regime}: {ratio:.2f}x Chinchilla, mean of 3 seeds" if ratio else f"{regime} (in progress)"
        ax.set_title(title + "; dashed: best seed-0 run of an unfinished arm", fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel("validation loss (nats / char)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / f"{NAME}.png", dpi=110)
    plt.close(fig)

