"""Where symmetry helps: one row per benchmark from the saved results, best Symo variant against the best baseline.

    python -m benchmarks.scoreboard        # reads benchmarks/results/*.json, writes scoreboard.{md,json}

Each benchmark is read on its own metric (lower is better for losses and RMSE, higher for cosines). A
Symo variant is any row whose name starts with "symo"; every other row is a baseline. The ratio is
Symo's best over the baseline's best, so below 1 means Symo wins on a loss and above 1 on a cosine.
The table also says which Symo variants each result includes, since not every benchmark has been
measured with every preset (see the notes it prints).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _split(values: dict[str, float]) -> tuple[tuple[str, float], tuple[str, float]] | None:
    sym = {k: v for k, v in values.items() if k.startswith("symo")}
    base = {k: v for k, v in values.items() if not k.startswith("symo")}
    if not sym or not base:
        return None
    return min(sym.items(), key=lambda kv: kv[1]), min(base.items(), key=lambda kv: kv[1])


def _losses(path: str, pick: Callable[[dict], dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    file = RESULTS / path
    if not file.exists():
        return {}
    data = json.loads(file.read_text())
    data.pop("machine", None)  # what the harness's writer adds beside the results
    return pick(data)


def _train_mlp(d: dict) -> dict[str, dict[str, float]]:
    return {p: {k: o["final_test_loss"][0] for k, o in s["optimizers"].items()} for p, s in d["problems"].items()}


def _paper_mlp(d: dict) -> dict[str, dict[str, float]]:
    # after 20 updates (the paper's tanh target) and after 100; the float64 reference row is not a variant
    return {f"paper_mlp {act}, after {n} updates": {k: o["test_loss_mean"][n] for k, o in opts.items()
                                                    if k != "symo_float64"}
            for act, opts in d.items() if isinstance(opts, dict)
            and all(isinstance(o, dict) and "test_loss_mean" in o for o in opts.values()) for n in ("20", "100")}


def _nanogpt(row: str) -> Callable[[dict], dict[str, dict[str, float]]]:
    return lambda d: {row: {k: o["val_final_mean"] for k, o in d["optimizers"].items()}}


def _nanogpt_matrix(d: dict) -> dict[str, dict[str, float]]:
    # one row per data-to-model regime; the screening pass is not a result
    return {f"nanogpt_matrix {regime}": {k: o["mean"] for k, o in r["arms"].items()}
            for regime, r in d.items() if isinstance(r, dict) and "arms" in r and regime != "screen"}


def _soap_seeds(d: dict) -> dict[str, dict[str, float]]:
    # the campaign's leading arms over six seeds instead of three
    return {f"nanogpt_matrix {regime}, six seeds": {k: o["seeds_6"]["final_val_mean"] for k, o in r["arms"].items()
                                                    if "seeds_6" in o}
            for regime, r in d.get("regimes", {}).items()}


def _rnn(d: dict) -> dict[str, dict[str, float]]:
    return {"rnn_train": {k: o["loss_final_mean"] for k, o in d["optimizers"].items()}}


def _hyperspectral(d: dict) -> dict[str, dict[str, float]]:
    return {f"hyperspectral density {dens}": {k: o["test_rmse_mean"] for k, o in opts.items()}
            for dens, opts in d.items()}


def _hessian_cosine(d: dict) -> dict[str, dict[str, float]]:
    out = {}
    for name, case in d["teacher_student"].items():
        # cosine with the true Hessian late in training; negated so that "lower is better" holds throughout
        out[f"hessian_cosine {name}"] = {k.replace(" ", "_"): -e["points"]["late"]["cos_frobenius"][0]
                                         for k, e in case["estimators"].items()}
    return out


READERS: list[tuple[str, str, Callable[[dict], dict[str, dict[str, float]]]]] = [
    ("paper_mlp.json", "test loss (float32)", _paper_mlp),
    ("train_mlp.json", "final test loss", _train_mlp),
    ("mnist_autoencoder.json", "final test loss", _train_mlp),
    ("rnn_train.json", "final eval MSE", _rnn),
    ("nanogpt_compare.json", "final validation loss", _nanogpt("nanogpt_compare")),
    # the reference size (batch 32 x context 128, 1000 steps): `python -m benchmarks.nanogpt_compare --reference`
    ("nanogpt_compare_reference.json", "final validation loss", _nanogpt("nanogpt_compare_reference")),
    # every preconditioner kind against tuned AdamW, Muon, SOAP and PSGD-Kron at two data-to-model ratios
    ("nanogpt_matrix.json", "final validation loss", _nanogpt_matrix),
    ("soap_seeds.json", "final validation loss", _soap_seeds),
    ("hyperspectral.json", "test RMSE", _hyperspectral),
    ("hessian_cosine.json", "cosine with the Hessian, late (higher is better)", _hessian_cosine),
]


def scoreboard() -> dict[str, dict]:
    board = {}
    for path, metric, pick in READERS:
        for bench, values in _losses(path, pick).items():
            split = _split(values)
            if split is None:
                continue
            (sv, s), (bv, b) = split
            higher = metric.endswith("(higher is better)")
            s_val, b_val = (-s, -b) if higher else (s, b)
            ratio = s_val / b_val if b_val else float("inf")
            wins = s < b
            tie = abs(ratio - 1) < 0.01
            board[bench] = {"metric": metric, "symo_best": {"variant": sv, "value": s_val},
                            "baseline_best": {"name": bv, "value": b_val}, "ratio": ratio,
                            "winner": "tie (within 1%)" if tie else (sv if wins else bv),
                            "symo_variants": sorted(k for k in values if k.startswith("symo"))}
    return board


def main() -> None:
    board = scoreboard()
    lines = ["# Scoreboard: where symmetry helps", "", "Command: `python -m benchmarks.scoreboard` (reads the saved "
             "results; it trains nothing).", "",
             "| benchmark | metric | best Symo variant | value | best baseline | value | ratio Symo/baseline | winner "
             "| Symo variants measured |", "|---|---|---|---:|---|---:|---:|---|---|"]
    for bench, r in board.items():
        lines.append(f"| {bench} | {r['metric']} | {r['symo_best']['variant']} | {r['symo_best']['value']:.4g} | "
                     f"{r['baseline_best']['name']} | {r['baseline_best']['value']:.4g} | {r['ratio']:.3g} | "
                     f"{r['winner']} | {', '.join(r['symo_variants'])} |")
    (RESULTS / "scoreboard.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "scoreboard.json").write_text(json.dumps(board, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
