"""Barren-plateau diagnostics: the variance of a cost's gradient over random initialisations against
the number of qubits, for a global and a local observable and two circuit depths.

    marlq plateau --ansatz strongly_entangling --qubits 2-14 --depths n,2 --samples 200 --out plateau.png

The circuit is the project's own (``circuits``): one encoding block of an input x drawn
uniformly from [-pi, pi)^n, then L ansatz layers with weights drawn uniformly from [0, 2 pi). The
cost is f = <O> with O = Z_0 x ... x Z_(n-1) (global) or Z_0 (local). For every initialisation the
gradient of f in every weight comes from the adjoint method of the circuits' public gradient API
(``circuits.gradients.expectation_gradients``: the statevector executor, each initialisation with
its own weights, complex128; the tests check it against PennyLane). Reported: Var[d f / d theta_k] over the
initialisations, averaged over all weights k (``pooled``; a weight outside the observable's light
cone contributes its zero variance), and for the single weight theta_(floor(L/2), 0, 0) (the first
weight of the middle layer). log Var = a - r n is fitted by least squares over n; r is the decay
rate per qubit in the legend (McClean et al. 2018: exponential decay for deep random circuits;
Cerezo et al. 2021: a local cost at shallow depth decays at most polynomially).

``--noise 0,0.01`` adds per-gate depolarizing noise (noise-induced plateaus, Wang et al. 2021):
for p > 0 the gradient comes from the noisy density-matrix path (``circuits.density``, the one the
heads use with a ``noise:`` section), by autograd, one initialisation at a time; up to
NOISY_MAX_QUBITS qubits.
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from circuits import gates
from circuits.blocks import ANSATZE, ENCODINGS, CircuitConfigError
from circuits.gradients import expectation_gradients
from circuits.spec import VQCConfig

COSTS = ("global", "local")
CHUNK_AMPLITUDES = 2**22  # initialisations per pass: at most this many amplitudes per state
NOISY_MAX_QUBITS = 10  # the density matrix has 4^n entries


def observable_diagonal(kind: str, n_qubits: int) -> np.ndarray:
    """The diagonal of Z_0 x ... x Z_(n-1) (global) or of Z_0 (local) in the computational basis."""
    z = 1.0 - 2.0 * gates.basis_bits(n_qubits)
    return np.prod(z, axis=1) if kind == "global" else z[:, 0]


def cost_gradients(ansatz: str, encoding: str, weights: torch.Tensor, inputs: torch.Tensor, observable: str,
                   dtype: torch.dtype = torch.complex128) -> tuple[torch.Tensor, torch.Tensor]:
    """f = <O> and d f / d weights for a batch of initialisations, each with its own weights, by the
    adjoint method (Jones and Gacon 2020) of the circuits' public gradient API
    (``circuits.gradients.expectation_gradients``, complex128 whatever ``dtype``).

    weights (B, L, n, k), inputs (B, n) -> (f (B,), gradient (B, L, n, k)).
    """
    _, layers, n_qubits, _ = weights.shape
    cfg = VQCConfig(n_qubits=n_qubits, layers=layers, ansatz=ansatz, encoding=encoding)
    f, grad = expectation_gradients(cfg, weights.detach().numpy(), inputs.detach().numpy(),
                                    observable_diagonal(observable, n_qubits))
    return torch.from_numpy(f), torch.from_numpy(grad)


def initialisations(ansatz: str, n_qubits: int, layers: int, observable: str, samples: int,
                    seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The random weights (samples, L, n, k) in [0, 2 pi) and inputs (samples, n) in [-pi, pi) of one point."""
    rng = np.random.default_rng([seed, n_qubits, layers, COSTS.index(observable)])
    k = ANSATZE[ansatz].weights_per_qubit
    weights = rng.uniform(0.0, 2.0 * math.pi, size=(samples, layers, n_qubits, k))
    return weights, rng.uniform(-math.pi, math.pi, size=(samples, n_qubits))


def gradient_variance(ansatz: str, encoding: str, n_qubits: int, layers: int, observable: str, samples: int,
                      seed: int, dtype: torch.dtype = torch.complex64, depolarizing: float = 0.0) -> dict[str, float]:
    """Var over ``samples`` random initialisations of d f / d theta: pooled over weights, and of the
    first weight of the middle layer. The same initialisations with or without noise."""
    weights, inputs = initialisations(ansatz, n_qubits, layers, observable, samples, seed)
    if depolarizing > 0:
        grad = noisy_gradients(ansatz, encoding, weights, inputs, observable, depolarizing, dtype)
    else:
        chunk = max(1, CHUNK_AMPLITUDES // 2**n_qubits)
        grads = []
        for start in range(0, samples, chunk):
            _, g = cost_gradients(ansatz, encoding, torch.from_numpy(weights[start:start + chunk]),
                                  torch.from_numpy(inputs[start:start + chunk]), observable, dtype)
            grads.append(g.numpy())
        grad = np.concatenate(grads)  # (samples, L, n, k)
    per_weight = grad.var(axis=0, ddof=1)
    return {"pooled": float(per_weight.mean()), "middle": float(per_weight[layers // 2, 0, 0])}


def noisy_gradients(ansatz: str, encoding: str, weights: np.ndarray, inputs: np.ndarray, observable: str,
                    depolarizing: float, dtype: torch.dtype = torch.complex64) -> np.ndarray:
    """d f / d theta (samples, L, n, k) with depolarizing noise p after every gate, by autograd through
    the density-matrix path, one initialisation at a time (each has its own weights)."""
    from circuits.density import DensityCircuit
    from circuits.spec import NoiseConfig

    samples, layers, n_qubits, _ = weights.shape
    cfg = VQCConfig(n_qubits=n_qubits, layers=layers, ansatz=ansatz, encoding=encoding,
                    noise=NoiseConfig(depolarizing=float(depolarizing)))
    circuit = DensityCircuit(cfg, dtype)
    real = torch.empty((), dtype=dtype).real.dtype
    diagonal = torch.as_tensor(observable_diagonal(observable, n_qubits), dtype=real)
    grads = np.empty(weights.shape)
    for i in range(samples):
        w = torch.tensor(weights[i], dtype=real, requires_grad=True)
        f = circuit.probabilities(torch.tensor(inputs[i:i + 1], dtype=real), w)[0] @ diagonal
        grads[i] = torch.autograd.grad(f, w)[0].numpy()
    return grads


def fit_decay(n: Sequence[float], variance: Sequence[float]) -> tuple[float, float]:
    """Least squares of log Var = a - r n: returns (r, exp(a)), the decay rate per qubit and prefactor."""
    n = np.asarray(n, dtype=float)
    log_var = np.log(np.asarray(variance, dtype=float))
    slope, intercept = np.polyfit(n, log_var, 1)
    return float(-slope), float(math.exp(intercept))


def parse_qubits(text: str) -> list[int]:
    """'2-14' or '2,4,6' -> qubit counts (each at least 2)."""
    try:
        if "-" in text:
            low, high = (int(v) for v in text.split("-", 1))
            values = list(range(low, high + 1))
        else:
            values = [int(v) for v in text.split(",")]
    except ValueError:
        raise ValueError(f"--qubits: expected a range like 2-14 or a list like 2,4,6, got {text!r}") from None
    if not values or min(values) < 2:
        raise ValueError(f"--qubits: every qubit count must be at least 2, got {text!r}")
    return values


def parse_depths(text: str) -> list[str]:
    """'n,2' -> depth rules: 'n' (L = n qubits) or a fixed positive integer."""
    rules = [v.strip() for v in text.split(",") if v.strip()]
    for rule in rules:
        if rule != "n" and not (rule.isdigit() and int(rule) >= 1):
            raise ValueError(f"--depths: each depth is n (as many layers as qubits) or a positive integer, got {rule!r}")
    if not rules:
        raise ValueError("--depths: give at least one depth, e.g. n,2")
    return rules


def depth_of(rule: str, n_qubits: int) -> int:
    return n_qubits if rule == "n" else int(rule)


def plot(results: list[dict], args: argparse.Namespace, path: Path) -> list[tuple[str, float, float]]:
    """log-variance vs n, one line per (observable, depth), fitted rates in the legend; returns the fits."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    fits = []
    noisy = any(p > 0 for p in args.noise_levels)
    for observable in args.observables:
        for rule in args.depth_rules:
            for p in args.noise_levels:
                rows = [r for r in results if r["observable"] == observable and r["depth"] == rule and r["noise"] == p]
                n = [r["n_qubits"] for r in rows]
                var = [r["var_pooled"] for r in rows]
                rate, pre = fit_decay(n, var)
                noise = f", p = {p:g}" if noisy else ""
                label = f"{'Z_0' if observable == 'local' else 'Z⊗…⊗Z'} ({observable}), L = {rule}{noise}: r = {rate:.2f} per qubit"
                line, = ax.semilogy(n, var, "o-" if observable == "global" else "s--", label=label,
                                    alpha=1.0 if p == 0 else 0.75)
                grid = np.linspace(min(n), max(n), 50)
                ax.semilogy(grid, pre * np.exp(-rate * grid), ":", color=line.get_color(), alpha=0.6)
                fits.append((f"{observable}, L={rule}{noise}", rate, pre))
    ax.set_xlabel("qubits n")
    ax.set_ylabel("Var[df/dθ] over initialisations (pooled over weights)")
    noise_title = ", depolarizing p per gate" if noisy else ""
    ax.set_title(f"Gradient variance vs qubits: {args.ansatz}, {args.encoding} encoding{noise_title}, "
                 f"{args.samples} random initialisations per point", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(title="observable, depth" + (", noise" if noisy else "") + ": fitted Var ∝ exp(-r n) (dotted)",
              fontsize=8, title_fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return fits


def main(argv: Sequence[str] | None = None) -> int:
    """Barren plateaus: gradient variance vs qubits (global vs local observable, two depths) with fitted decay rates."""
    p = argparse.ArgumentParser(prog="marlq plateau", description=__doc__.splitlines()[0])
    p.add_argument("--ansatz", default="strongly_entangling")
    p.add_argument("--encoding", default="angle_x")
    p.add_argument("--qubits", default="2-14", help="a range 2-14 or a list 2,4,6")
    p.add_argument("--depths", default="n,2", help="n (L = n) and/or fixed layer counts, comma-separated")
    p.add_argument("--observables", default="global,local")
    p.add_argument("--samples", type=int, default=200, help="random initialisations per point")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--noise", default="0", help="depolarizing probabilities per gate, comma-separated (0: noiseless; "
                   f"p > 0 takes the density-matrix path, n <= {NOISY_MAX_QUBITS})")
    p.add_argument("--out", type=Path, required=True, help="the PNG; a CSV of the points is written beside it")
    args = p.parse_args(argv)
    try:
        if args.ansatz not in ANSATZE:
            raise CircuitConfigError(f"--ansatz: unknown ansatz {args.ansatz!r}; choices: {', '.join(ANSATZE)}")
        if args.encoding not in ENCODINGS:
            raise CircuitConfigError(f"--encoding: unknown encoding {args.encoding!r}; choices: {', '.join(ENCODINGS)}")
        qubits = parse_qubits(args.qubits)
        args.depth_rules = parse_depths(args.depths)
        args.observables = [o.strip() for o in args.observables.split(",")]
        for o in args.observables:
            if o not in COSTS:
                raise ValueError(f"--observables: unknown observable {o!r}; choices: {', '.join(COSTS)}")
        if args.samples < 2:
            raise ValueError(f"--samples: at least 2 initialisations are needed for a variance, got {args.samples}")
        try:
            args.noise_levels = [float(v) for v in args.noise.split(",")]
        except ValueError:
            raise ValueError(f"--noise: expected comma-separated probabilities, got {args.noise!r}") from None
        for level in args.noise_levels:
            if not 0.0 <= level <= 1.0:
                raise ValueError(f"--noise: a probability must lie in [0, 1], got {level:g}")
        if any(level > 0 for level in args.noise_levels) and max(qubits) > NOISY_MAX_QUBITS:
            raise ValueError(f"--noise: the density-matrix path goes up to {NOISY_MAX_QUBITS} qubits, "
                             f"--qubits asks for {max(qubits)}")
        if args.out.exists() and args.out.is_dir():
            raise ValueError(f"--out: {args.out} is a directory; give a .png file name")
    except ValueError as exc:
        print(f"marlq: error: {exc}", file=sys.stderr)
        return 2
    results = []
    print(f"{'observable':<10}{'depth':>6}{'noise':>7}{'n':>4}{'L':>4}{'var pooled':>14}{'var middle':>14}{'seconds':>9}")
    for observable in args.observables:
        for rule in args.depth_rules:
            for p_noise in args.noise_levels:
                for n in qubits:
                    t0 = time.perf_counter()
                    layers = depth_of(rule, n)
                    var = gradient_variance(args.ansatz, args.encoding, n, layers, observable, args.samples, args.seed,
                                            depolarizing=p_noise)
                    seconds = time.perf_counter() - t0
                    results.append({"observable": observable, "depth": rule, "noise": p_noise, "n_qubits": n,
                                    "layers": layers, "var_pooled": var["pooled"], "var_middle": var["middle"],
                                    "seconds": seconds})
                    print(f"{observable:<10}{rule:>6}{p_noise:>7g}{n:>4}{layers:>4}{var['pooled']:>14.4e}"
                          f"{var['middle']:>14.4e}{seconds:>9.2f}", flush=True)
    csv_path = args.out.with_suffix(".csv")
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(results[0]))
        writer.writeheader()
        writer.writerows(results)
    fits = plot(results, args, args.out)
    for name, rate, pre in fits:
        print(f"fit {name}: Var = {pre:.3g} exp(-{rate:.3f} n)  (r = {rate:.3f} per qubit, x{math.exp(-rate):.3f} per added qubit)")
    print(f"plot: {args.out}\npoints: {csv_path}")
    return 0


COMMANDS = {"plateau": main}  # marlq plateau ...

if __name__ == "__main__":
    sys.exit(main())
