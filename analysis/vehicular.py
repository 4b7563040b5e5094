"""Vehicular relays (docs/vehicular.md): train over seeds, evaluate at several penetration ratios, plot and summarise.

    marlq vehicular --config scenarios/vehicular_a3c.yaml --seeds 5 --out sweeps/vehicular

Training is ``marlq run`` (one subprocess per seed, skipped when its run directory is complete);
evaluation is ``marlq vehicular_eval`` (``evaluate_main`` below: one subprocess per run, written to
``eval/seed_<s>.csv``).
This module itself only reads those files and draws: coverage and relay length against p for the
learned policy and the baselines (mean and 95% band over seeds), the rendered frame of a learned
relay, and ``figures.json`` with the acceptance ratios.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
from analysis.stats import mean_ci
from marl_q.seeding import (vehicular_eval_episode_seed, vehicular_eval_seed,
                             vehicular_traffic_seed)

POLICIES = ("learned", "no_control", "greedy", "random")
LABELS = {"learned": "A3C (shared policy)", "no_control": "no control (traffic model)",
          "greedy": "greedy gap-filling", "random": "random moves"}
TEXT_COLUMNS = ("policy", "act")
COLOURS = {"learned": "tab:red", "no_control": "tab:blue", "greedy": "tab:green", "random": "tab:gray"}


def mean_ci95(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of a Student-t 95% interval over seeds (0 for a single seed)."""
    mean, half = mean_ci(values)
    return float(mean), float(half)


def read_evaluations(root: Path) -> list[dict]:
    """All rows of ``root/eval/seed_*.csv`` with numbers parsed."""
    rows = []
    for path in sorted((root / "eval").glob("seed_*.csv")):
        with open(path) as fh:
            for row in csv.DictReader(fh):
                rows.append({k: (v if k in TEXT_COLUMNS else float(v)) for k, v in row.items()})
    return rows


def table(rows: list[dict], metric: str) -> dict[str, dict[float, list[float]]]:
    """policy -> p -> per-seed values of ``metric``."""
    out: dict[str, dict[float, list[float]]] = {}
    for row in rows:
        out.setdefault(row["policy"], {}).setdefault(row["penetration"], []).append(row[metric])
    return out


def acceptance_figures(rows: list[dict], train_p: float = 0.2) -> dict:
    """Learned / no-control coverage per p (ratio of seed means), per-seed ratios at train_p, relay lengths."""
    cov, relay = table(rows, "coverage"), table(rows, "relay_length_m")
    out: dict = {"seeds": len(cov.get("learned", {}).get(train_p, [])), "per_p": {}}
    for p in sorted(cov.get("learned", {})):
        entry = {}
        for name in POLICIES:
            if p in cov.get(name, {}):
                entry[f"coverage_{name}"] = mean_ci95(cov[name][p])
                entry[f"relay_length_m_{name}"] = mean_ci95(relay[name][p])
        entry["coverage_ratio_learned_vs_no_control"] = (entry["coverage_learned"][0]
                                                         / entry["coverage_no_control"][0])
        entry["learned_not_below_no_control"] = entry["coverage_learned"][0] >= entry["coverage_no_control"][0]
        for name in ("learned", "greedy"):
            per_seed = paired_ratios(rows, name).get(p)
            if per_seed:
                entry[f"coverage_ratio_{name}_per_seed"] = mean_ci95(per_seed)
        out["per_p"][str(p)] = entry
    if train_p in cov.get("learned", {}):
        out["ratio_at_train_p"] = out["per_p"][str(train_p)]["coverage_ratio_learned_vs_no_control"]
        out["target_1.3x_met"] = out["ratio_at_train_p"] >= 1.3
        out["never_below_no_control"] = all(e["learned_not_below_no_control"] for e in out["per_p"].values())
    return out


def label(name: str, rows: list[dict]) -> str:
    """A policy's legend label; the learned one says how it picked moves (sampled or argmax) when known."""
    acts = sorted({r["act"] for r in rows if r.get("policy") == name and r.get("act")})
    return LABELS[name] + (f", {'/'.join(acts)} moves" if name == "learned" and acts else "")


def plot_against_p(rows: list[dict], metric: str, ylabel: str, title: str, path: Path) -> Path:
    """One line per policy: the seed mean of ``metric`` against p with a 95% band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from analysis.plots import save_figure

    data = table(rows, metric)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    seeds = 0
    for name in POLICIES:
        if name not in data:
            continue
        ps = sorted(data[name])
        stats = [mean_ci95(data[name][p]) for p in ps]
        seeds = max(seeds, max(len(data[name][p]) for p in ps))
        mean = np.array([s[0] for s in stats])
        half = np.array([s[1] for s in stats])
        ax.plot(ps, mean, marker="o", color=COLOURS[name], label=label(name, rows))
        ax.fill_between(ps, mean - half, mean + half, color=COLOURS[name], alpha=0.2)
    ax.set_xlabel("mmWave penetration ratio p (fraction of uncontrolled vehicles)")
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title}\n(trained at p = 0.2; mean and 95% band over {seeds} seeds)", fontsize=10)
    return save_figure(fig, ax, path)


def paired_ratios(rows: list[dict], policy: str, metric: str = "coverage") -> dict[float, list[float]]:
    """p -> per-seed ratios policy / no control of ``metric`` (same run seed, same traffic seeds)."""
    by = {(r["policy"], r["penetration"], r["run_seed"]): r[metric] for r in rows}
    out: dict[float, list[float]] = {}
    for (name, p, seed), value in sorted(by.items()):
        base = by.get(("no_control", p, seed))
        if name == policy and base:
            out.setdefault(p, []).append(value / base)
    return out


def plot_ratios(rows: list[dict], path: Path, target: float = 1.3) -> Path:
    """Coverage of each policy over no control's (per-seed ratio, mean and 95% band) against p, with the target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from analysis.plots import save_figure

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    seeds = 0
    for name in ("learned", "greedy", "random"):
        ratios = paired_ratios(rows, name)
        if not ratios:
            continue
        ps = sorted(ratios)
        stats = [mean_ci95(ratios[p]) for p in ps]
        seeds = max(seeds, max(len(ratios[p]) for p in ps))
        mean, half = np.array([s[0] for s in stats]), np.array([s[1] for s in stats])
        ax.plot(ps, mean, marker="o", color=COLOURS[name], label=label(name, rows))
        ax.fill_between(ps, mean - half, mean + half, color=COLOURS[name], alpha=0.2)
    ax.axhline(1.0, color=COLOURS["no_control"], lw=1, label="no control (= 1)")
    ax.axhline(target, color="black", ls="--", lw=1, label=f"target at p = 0.2 ({target}x)")
    ax.set_xlabel("mmWave penetration ratio p (fraction of uncontrolled vehicles)")
    ax.set_ylabel("coverage / coverage under no control (ratio)")
    ax.set_title(f"Coverage relative to no control, per seed\n(trained at p = 0.2; mean and 95% band over "
                 f"{seeds} seeds)", fontsize=10)
    return save_figure(fig, ax, path)


def plot_frame(frame: np.ndarray, road_length_m: float, path: Path, title: str) -> Path:
    """The rendered top-down frame with a metre scale along the road and a colour legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(14, 2.8))
    ax.imshow(frame, aspect="auto", extent=(0, road_length_m, frame.shape[0], 0), interpolation="nearest")
    ax.set_xlabel("position along the road (m)")
    ax.set_yticks([])
    ax.set_ylabel("RSUs / lanes 0-2\n/ coverage", fontsize=8)
    ax.set_title(title, fontsize=10)
    legend = [Patch(color=np.array(c) / 255, label=l) for c, l in [
        ((0, 0, 0), "RSU"), ((220, 20, 20), "agent, RSU-connected"), ((255, 165, 0), "agent, cut off"),
        ((20, 60, 200), "mmWave, connected"), ((140, 190, 240), "mmWave, cut off"),
        ((110, 110, 110), "no mmWave"), ((0, 160, 60), "LOS link / covered road")]]
    ax.legend(handles=legend, ncol=7, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.35))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def placement_bound(road, step_cells: int = 3) -> tuple[float, float]:
    """(coverage as the road is, coverage with its agents re-placed greedily) on one frozen snapshot.

    The agents' vehicles are lifted off the road and put back one at a time, each on the free cell
    (every ``step_cells``-th cell of every lane) that raises coverage most: a lower bound on what the
    best static deployment of the same agents reaches, i.e. what the geometry allows when traffic
    dynamics are ignored.
    """
    as_is = road.relay_state().coverage
    saved = {name: getattr(road, name).copy() for name in ("lane", "cell", "speed", "mmwave", "agent_id")}
    agents = int((road.agent_id >= 0).sum())
    road._reorder(road.agent_id < 0)
    try:
        coverage = road.relay_state().coverage
        for _ in range(agents):
            taken = set(zip(road.lane.tolist(), road.cell.tolist()))
            best, best_cov = None, -1.0
            base = {name: getattr(road, name) for name in ("lane", "cell", "speed", "mmwave", "agent_id")}
            for lane in range(road.cfg.lanes):
                for cell in range(0, road.n_cells, step_cells):
                    if (lane, cell) in taken:
                        continue
                    road.lane, road.cell = np.append(base["lane"], lane), np.append(base["cell"], cell)
                    road.mmwave = np.append(base["mmwave"], True)
                    cov = road.relay_state().coverage
                    if cov > best_cov:
                        best, best_cov = (lane, cell), cov
            road.lane, road.cell = np.append(base["lane"], best[0]), np.append(base["cell"], best[1])
            road.mmwave = np.append(base["mmwave"], True)
            road.speed, road.agent_id = np.append(base["speed"], 0), np.append(base["agent_id"], 0)
            coverage = best_cov
    finally:
        for name, value in saved.items():
            setattr(road, name, value)
    return as_is, coverage


class EdgeHold:
    """Oracle probe with full knowledge of the road: an agent that is the outermost RSU-connected
    vehicle on its side of its nearest RSU (nothing connected within ``outward_cells`` farther out),
    with the next connected vehicle inwards at least ``inward_cells`` back, slows to ``min_speed``
    to hold the relay's edge; every other agent drives with the traffic."""

    def __init__(self, env, min_speed: int, inward_cells: int = 14, outward_cells: int = 20) -> None:
        self.env, self.min_speed = env, min_speed
        self.inward_cells, self.outward_cells = inward_cells, outward_cells

    def __call__(self, obs: dict[str, np.ndarray]) -> dict[str, int]:
        from scenarios.vehicular_road import DECELERATE as SLOW

        road = self.env.road
        connected = self.env._connected_vehicles()
        cx = road.cell[connected]
        rsu_cells = road.rsu_x / road.cfg.cell_m
        acts = {}
        for name in obs:
            k = int(np.nonzero(road.agent_id == int(name.split("_")[1]))[0][0])
            if not connected[k] or road.speed[k] <= self.min_speed:
                continue
            outward = 1 if road.cell[k] > rsu_cells[np.argmin(np.abs(rsu_cells - road.cell[k]))] else -1
            rel = (cx - road.cell[k]) * outward
            inward = -rel[rel < 0]
            if not ((rel > 0) & (rel <= self.outward_cells)).any() and (inward.min() if len(inward) else 10 ** 6) >= self.inward_cells:
                acts[name] = SLOW
        return acts


# ---------------------------------------------------------------------------------------------
# Evaluating one trained run: the learned policy and the baselines at several penetration ratios
# ---------------------------------------------------------------------------------------------

ACT_MODES = ("sample", "argmax")


def evaluate_policy(env, policy, seed: int, episodes: int = 1) -> dict[str, float]:
    """Run ``episodes`` episodes of a policy (``agents.vehicular.RelayPolicy``) in the rollout loop
    every family shares (``agents.rollout``, the highway as ``agents.vehicular.Highway``, episode
    ``k`` reset with ``vehicular_eval_episode_seed(seed, k)``); the time-averaged coverage, relay
    length and agent reward per step."""
    from agents.rollout import EpisodeBook, rollout
    from agents.vehicular import Highway

    coverage, relay, relay_max, reward = [], [], [], []

    def store(t: int, seen: Any, moves: Any, step: Any) -> None:
        _, rew, _, _, _, metrics = step.data
        coverage.append(metrics["coverage"])
        relay.append(metrics["relay_length_m"])
        relay_max.append(metrics["relay_length_max_m"])
        if rew:
            reward.append(float(np.mean(list(rew.values()))))

    vec = Highway(env, seed, episode_seed=vehicular_eval_episode_seed)
    rollout(vec, EpisodeBook(1), None, lambda seen: policy({a: vec.obs[a] for a in seen[0]}), store, until=episodes)
    return {"coverage": float(np.mean(coverage)), "relay_length_m": float(np.mean(relay)),
            "relay_length_max_m": float(np.mean(relay_max)), "reward": float(np.mean(reward)) if reward else 0.0}


class LearnedPolicy:
    """The shared actor of a finished run (``marl_q.rundir.load_trained``): ``act="sample"`` draws from
    its action distribution with a generator seeded ``seed``, ``act="argmax"`` takes the most likely
    move (deployment)."""

    def __init__(self, run_dir: Path, seed: int = 0, act: str = "sample") -> None:
        from marl_q.errors import ConfigError
        from marl_q.rundir import load_trained

        if act not in ACT_MODES:
            raise ConfigError(f"act: {act!r} is not one of {', '.join(ACT_MODES)}")
        self.trained = load_trained(run_dir)
        self.cfg = self.trained.cfg
        self.rng = np.random.default_rng(seed) if act == "sample" else None

    def __call__(self, obs: dict[str, np.ndarray]) -> dict[str, int]:
        return self.trained.act(obs, self.rng)


def make_relay_env(scenario_params: Any, **overrides: Any):
    """A vehicular relay environment from a config's scenario section, with fields overridden."""
    from scenarios.vehicular_relay import VehicularRelayEnv
    from scenarios.vehicular_road import VehicularRelayConfig

    fields = {f.name: getattr(scenario_params, f.name) for f in dataclasses.fields(VehicularRelayConfig)}
    fields.update(overrides)
    return VehicularRelayEnv(VehicularRelayConfig(**fields), render_mode="rgb_array")


def evaluate_run(run_dir: Path, penetrations: list[float], episodes: int,
                 act: str = "sample") -> tuple[list[dict[str, Any]], np.ndarray]:
    """Rows (policy, p, coverage, relay length) for the learned policy and each baseline; plus one rendered frame.

    Evaluation seeds differ from training seeds; every policy sees the same traffic seeds. The frame
    is the learned policy at the training penetration ratio after 150 s (or the episode's last second).
    """
    from agents.vehicular import BASELINES

    learned = LearnedPolicy(run_dir, act=act)
    cfg = learned.cfg
    seed = vehicular_eval_seed(cfg.run.seed)
    rows = []
    for p in penetrations:
        env = make_relay_env(cfg.scenario.params, penetration=float(p))
        policies = {"learned": learned, **{name: mk(env.cfg, seed) for name, mk in BASELINES.items()}}
        for name, policy in policies.items():
            result = evaluate_policy(env, policy, seed=seed, episodes=episodes)
            rows.append({"run_seed": cfg.run.seed, "policy": name, "penetration": float(p), **result,
                         "act": act})  # how the learned policy picked its moves in this evaluation
    env = make_relay_env(cfg.scenario.params)
    obs, _ = env.reset(seed=seed)
    for _ in range(min(150, env.cfg.max_steps - 1)):
        obs, *_ = env.step(learned({a: obs[a] for a in env.agents}))
    return rows, env.render()


def evaluate_main(argv: Optional[Sequence[str]] = None) -> int:
    """Evaluate one trained run at penetration ratios (RUN_DIR --p 0.1 0.2 --episodes 2 --out eval.csv)."""
    import torch

    from marl_q.errors import UserError

    parser = argparse.ArgumentParser(prog="marlq vehicular_eval", description=evaluate_main.__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--p", type=float, nargs="+", default=[0.1, 0.2, 0.3, 0.5])
    parser.add_argument("--episodes", type=int, default=2)
    parser.add_argument("--act", choices=ACT_MODES, default="sample",
                        help="learned policy: sample its action distribution or take the most likely move")
    parser.add_argument("--out", type=Path, required=True, help="CSV of results; the frame goes beside it (.npy)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    bad = [p for p in args.p if not 0.0 <= p <= 1.0]
    if bad:
        print(f"--p: {bad} outside [0, 1]", file=sys.stderr)
        return 2
    try:
        rows, frame = evaluate_run(args.run_dir, args.p, args.episodes, act=args.act)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    np.save(args.out.with_suffix(".frame.npy"), frame)
    return 0


def reachability(config: str, p: float = 0.2, seeds: int = 4, snapshot_s: int = 50) -> dict:
    """Is 1.3x no control reachable? Coverage of fixed local rules (no control, greedy, drive in lane k),
    and the static placement bound on snapshots of uncontrolled traffic; same traffic seeds as evaluation."""
    from agents.vehicular import BASELINES, LanePreference, ObservationLayout
    from marl_q.config import load_config

    cfg = load_config(Path(config))
    env = make_relay_env(cfg.scenario.params, penetration=p)
    layout = ObservationLayout.of(env.cfg)
    policies = {"no_control": BASELINES["no_control"](env.cfg, 0), "greedy": BASELINES["greedy"](env.cfg, 0),
                **{f"lane_{k}": LanePreference(layout, k) for k in range(env.cfg.lanes)},
                **{f"lane_{k}_insist": LanePreference(layout, k, insist=True) for k in range(env.cfg.lanes)},
                **{f"oracle_edge_hold_speed_{v}": EdgeHold(env, v) for v in (0, 1, 2)}}
    out: dict = {"p": p, "seeds": seeds, "coverage": {}}
    for name, policy in policies.items():
        values = [evaluate_policy(env, policy, seed=vehicular_traffic_seed(s))["coverage"] for s in range(seeds)]
        out["coverage"][name] = mean_ci95(values)
    base = out["coverage"]["no_control"][0]
    out["ratio_vs_no_control"] = {name: v[0] / base for name, v in out["coverage"].items()}
    snaps = []
    for s in range(seeds):
        env.reset(seed=vehicular_traffic_seed(s))
        for _ in range(snapshot_s):
            env.step({})
        snaps.append(placement_bound(env.road))
    out["placement_snapshot_coverage"] = mean_ci95([a for a, _ in snaps])
    out["placement_bound_coverage"] = mean_ci95([b for _, b in snaps])
    out["placement_ratio"] = out["placement_bound_coverage"][0] / out["placement_snapshot_coverage"][0]
    return out


def report(root: Path) -> dict:
    """Plots and figures.json from the evaluations under ``root``."""
    rows = read_evaluations(root)
    if not rows:
        raise SystemExit(f"error: {root}/eval holds no seed_*.csv evaluations")
    plots = root / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    scenario = {}
    configs = sorted((root / "train").glob("seed_*/config.yaml"))
    if configs:
        import yaml

        scenario = yaml.safe_load(configs[0].read_text())["scenario"]
    length = float(scenario.get("road_length_m", 3000.0))
    trained = f"A3C reward: {scenario['reward']}; " if "reward" in scenario else ""
    plot_against_p(rows, "coverage", "coverage (fraction of road cells within range)",
                   f"Coverage of a {length / 1000:g} km highway by RSU-connected relays ({trained.rstrip('; ')})",
                   plots / "coverage_vs_p.png")
    plot_against_p(rows, "relay_length_m", "relay length (m, mean over RSUs)",
                   f"Relay length from the RSUs ({trained.rstrip('; ')})", plots / "relay_length_vs_p.png")
    plot_ratios(rows, plots / "coverage_ratio_vs_p.png")
    frames = sorted((root / "eval").glob("seed_*.frame.npy"))
    if frames:
        acts = sorted({r["act"] for r in rows if r.get("act")})
        how = f", {'/'.join(acts)} moves" if acts else ""
        plot_frame(np.load(frames[0]), length, plots / "learned_relay_frame.png",
                   f"Learned policy{how} at p = 0.2 after 150 s ({frames[0].name.split('.')[0]})")
    figures = acceptance_figures(rows)
    (root / "figures.json").write_text(json.dumps(figures, indent=2))
    return figures


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Vehicular relays: train --seeds runs, evaluate each at penetration ratios --p, then plot and summarise."""
    parser = argparse.ArgumentParser(prog="marlq vehicular", description=main.__doc__ + " --report-only skips training and evaluation.")
    parser.add_argument("--config", default="scenarios/vehicular_a3c.yaml")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("sweeps/vehicular"))
    parser.add_argument("--p", type=float, nargs="+", default=[0.1, 0.2, 0.3, 0.5])
    parser.add_argument("--episodes", type=int, default=2, help="evaluation episodes per policy and p")
    parser.add_argument("--act", choices=("sample", "argmax"), default="sample",
                        help="how the learned policy acts at evaluation: sample its distribution or argmax")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="key=value for marlq run")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--reachability", action="store_true",
                        help="only measure fixed local rules and the static placement bound at p = 0.2 (no training)")
    args = parser.parse_args(argv)
    if args.reachability:
        figures = reachability(args.config, seeds=args.seeds)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "reachability.json").write_text(json.dumps(figures, indent=2))
        print(json.dumps(figures, indent=2))
        return 0
    if args.seeds < 1:
        print(f"--seeds: {args.seeds} must be at least 1", file=sys.stderr)
        return 2
    if not args.report_only:
        for seed in range(args.seeds):
            run_dir = args.out / "train" / f"seed_{seed}"
            if not (run_dir / "summary.json").exists():
                cmd = [sys.executable, "-m", "marl_q.cli", "run", args.config, "--seed", str(seed),
                       "--out", str(run_dir), "--set", "run.progress=false", "--set", "run.plots=false"]
                for item in args.overrides:
                    cmd += ["--set", item]
                code = subprocess.call(cmd)
                if code != 0:
                    return code
            eval_csv = args.out / "eval" / f"seed_{seed}.csv"
            if not eval_csv.exists():
                cmd = [sys.executable, "-m", "marl_q.cli", "vehicular_eval", str(run_dir), "--episodes",
                       str(args.episodes), "--act", args.act, "--out", str(eval_csv), "--p", *[str(p) for p in args.p]]
                code = subprocess.call(cmd)
                if code != 0:
                    return code
    figures = report(args.out)
    print(json.dumps(figures, indent=2))
    return 0


def bench_env_speed(argv: list[str]) -> int:
    """Env steps/s of vehicular_relay with 20 agents under no control, random and A3C-sized policies.

    For the old reward/observation (marginal_coverage, grid) and the trained one (difference,
    grid_features, speed-keeping), on the default road."""
    import time

    import torch

    from agents.vehicular import RandomMoves, no_control
    from scenarios.vehicular_relay import VehicularRelayEnv

    parser = argparse.ArgumentParser(prog="marlq bench vehicular_env", description=bench_env_speed.__doc__)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--agents", type=int, default=20)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    settings = {"marginal_coverage/grid": {},
                "difference/grid_features": dict(reward="difference", observation="grid_features", penalty_slow=0.1)}
    for label, overrides in settings.items():
        env = VehicularRelayEnv(n_agents=args.agents, max_steps=args.steps + 1, **overrides)
        actor = torch.nn.Sequential(torch.nn.Linear(env.obs_dim, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                                    torch.nn.Tanh(), torch.nn.Linear(64, 5))

        @torch.no_grad()
        def mlp_policy(obs: dict[str, np.ndarray]) -> dict[str, int]:
            names = sorted(obs)
            logits = actor(torch.from_numpy(np.stack([obs[n] for n in names])))
            return dict(zip(names, logits.argmax(1).tolist()))

        print(f"vehicular_relay ({label}): {env.cfg.lanes} lanes x {env.cfg.road_length_m:.0f} m, {args.agents} "
              f"agents, {args.steps} steps per policy")
        for name, policy in (("no_control", no_control), ("random", RandomMoves(0)), ("mlp_64x64", mlp_policy)):
            obs, _ = env.reset(seed=0)
            agent_steps = 0
            start = time.perf_counter()
            for _ in range(args.steps):
                agent_steps += len(env.agents)
                obs, *_ = env.step(policy({a: obs[a] for a in env.agents}))
            elapsed = time.perf_counter() - start
            print(f"  {name:<11} {args.steps / elapsed:8.0f} env steps/s  {agent_steps / elapsed:9.0f} agent steps/s  "
                  f"(mean {agent_steps / args.steps:.1f} agents, {len(env.road.lane)} vehicles at the end)")
    return 0


COMMANDS = {"vehicular": main, "vehicular_eval": evaluate_main}  # marlq vehicular ..., marlq vehicular_eval RUN_DIR ...
BENCHES = {"vehicular_env": bench_env_speed}  # marlq bench vehicular_env

if __name__ == "__main__":
    raise SystemExit(main())
