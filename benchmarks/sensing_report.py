"""The outputs of benchmarks/matrix_sensing.py: its JSON, its markdown tables and its plot."""

from __future__ import annotations

from pathlib import Path

from benchmarks.harness import write_results


def write_outputs(data: dict, out: Path) -> None:
    write_results(out, "matrix_sensing", render_md(data), data)
    plot(data, out / "matrix_sensing.png")




def render_md(data: dict) -> str:
    lines = ["# Matrix sensing: the optimizer zoo, the dial and the spectral tail", "",
             f"Command: `{data['command']}`", "",
             "40 x 40 rank-3 target, factors 40 x 40 (k = 40), m = 462 Gaussian measurements, init 1e-3, "
             "seeds 42/123/456, float32 (the published protocol, §1-3). The learning rate of each rule is selected by "
             "the protocol's rule, i.e. **against the ground truth** (mean recovery if every seed interpolates).",
             ""]
    if "zoo" in data:
        lines += ["## The zoo (sorted by recovery error)", "",
                  "| rule | lr | recovery (mean ± std) | eff. rank | balancedness | steps | max final loss "
                  "| equivariant (O(k) gauge) | step-1 defect |",
                  "|---|---|---|---|---|---|---|---|---|"]
        rows = sorted(data["zoo"].items(), key=lambda kv: kv[1]["recovery_mean"])
        for rule, z in rows:
            edge = " (grid edge)" if z.get("lr_at_grid_edge") else ""
            lines.append(f"| {rule} | {z['lr']:g}{edge} | {z['recovery_mean']:.4f} ± {z['recovery_std']:.4f} | "
                         f"{z['erank_mean']:.2f} | {z['balancedness_mean']:.2e} | {z['steps_mean']:.0f} | "
                         f"{z['final_loss_max']:.1e} | {'yes' if z['equivariant'] else 'no'} | "
                         f"{z['first_step_defect']:.1e} |")
        if "nuclear_norm" in data:
            nn = data["nuclear_norm"]
            lines.append(f"| min nuclear norm (cvxpy) | - | {nn['recovery_mean']:.4f} ± {nn['recovery_std']:.4f} | "
                         f"{nn['erank_mean']:.2f} | - | - | - | - | - |")
        lines.append("")
    if "dial" in data:
        lines += ["## The anisotropy dial (Adam-p; p = 1 Adam, p = 0 shared-scalar Adam)", "",
                  "| p | lr | recovery | eff. rank | steps |", "|---|---|---|---|---|"]
        for d in data["dial"]:
            edge = " (grid edge)" if d.get("lr_at_grid_edge") else ""
            lines.append(f"| {d['p']:g} | {d['lr']:g}{edge} | {d['recovery_mean']:.4f} | {d['erank_mean']:.2f} | "
                         f"{d['steps_mean']:.0f} |")
        lines.append("")
    if "tail" in data:
        rules = sorted({t["rule"] for t in data["tail"]}, key=lambda r: (r.startswith("symo"), r))
        taus = sorted({t["tau"] for t in data["tail"]})
        lines += ["## The spectral tail: recovery error against tail energy tau^2 (columns: tau)", "",
                  "| rule | " + " | ".join(f"{t:g}" for t in taus) + " |", "|---" * (len(taus) + 1) + "|"]
        for r in rules:
            vals = {t["tau"]: (t["recovery_mean"], "*" if t.get("lr_at_grid_edge") else "")
                    for t in data["tail"] if t["rule"] == r}
            lines.append(f"| {r} | " + " | ".join("{:.4f}{}".format(*vals.get(t, (float("nan"), ""))) for t in taus)
                         + " |")
        lines += ["", "\\* the chosen rate is at an end of the rule's grid (the protocol's grids have two rates).", ""]
    for key in ("findings", "notes"):
        if key in data:
            lines += [f"## {key.capitalize()}", ""] + [f"- {x}" for x in data[key]] + [""]
    return "\n".join(lines)


def plot(data: dict, path: Path) -> None:
    # matplotlib only here: slow to import, and nothing but the plot needs it
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [k for k in ("zoo", "dial", "tail") if k in data]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, key in zip(axes[0], panels):
        if key == "zoo":
            rows = sorted(data["zoo"].items(), key=lambda kv: kv[1]["recovery_mean"])
            colors = ["tab:blue" if z["equivariant"] else "tab:red" for _, z in rows]
            ax.barh([r for r, _ in rows], [min(z["recovery_mean"], 2.0) for _, z in rows], color=colors)
            if "nuclear_norm" in data:
                ax.axvline(data["nuclear_norm"]["recovery_mean"], color="k", ls="--", label="min nuclear norm")
                ax.legend()
            ax.set_xlabel("recovery error (blue: equivariant, red: not)")
        elif key == "dial":
            ps = [d["p"] for d in data["dial"]]
            ax.plot(ps, [d["recovery_mean"] for d in data["dial"]], "o-", label="recovery")
            ax2 = ax.twinx()
            ax2.plot(ps, [d["erank_mean"] for d in data["dial"]], "s--", color="tab:orange", label="eff. rank")
            ax.set_xlabel("p (1 = Adam, 0 = shared-scalar Adam)")
            ax.set_ylabel("recovery error")
            ax2.set_ylabel("effective rank")
        else:
            for r in sorted({t["rule"] for t in data["tail"]}):
                pts = sorted((t["tau"], t["recovery_mean"]) for t in data["tail"] if t["rule"] == r)
                ax.plot([p[0] ** 2 for p in pts], [p[1] for p in pts], "o-", label=r, ms=3)
            ax.set_xlabel("tail energy tau^2")
            ax.set_ylabel("recovery error")
            ax.set_yscale("log")
            ax.legend(fontsize=7)
        ax.set_title(key)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
