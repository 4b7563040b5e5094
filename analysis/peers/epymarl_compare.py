"""marl-q against EPyMARL itself: the same task and budget, env steps per second and returns, one core each.

EPyMARL (github.com/uoe-agents/epymarl at cbc38c0) runs in its own virtualenv, which
``analysis/peers/epymarl.sh`` builds; its checkout is passed by path (``--epymarl-dir``, or the env
var ``EPYMARL_DIR``) and is not part of this repository. Each EPyMARL run copies the checkout's
``src/`` unchanged into a fresh folder under ``--work`` (EPyMARL writes its sacred results next to its
``src/``) and runs its ``src/main.py`` there, as its README says:

    python src/main.py --config=ALG --env-config=gymma with env_args.key=KEY env_args.time_limit=T \\
        seed=S t_max=STEPS use_cuda=False test_interval=... test_nepisode=...

with its own ``config/algs/{qmix,vdn,iql,mappo}.yaml`` and ``default.yaml``/``envs/gymma.yaml``; the only
keys given are the task (``env_args``), the budget (``t_max``), the seed, and its greedy test runs
cut to the least it allows (one test batch at t=0: ``test_interval`` past ``t_max``, ``test_nepisode``
= ``batch_size_run``; marl-q's evaluation is off too). The child process (``--child-epymarl``) loads
``main.py`` with ``runpy`` as ``__main__`` and observes it without changing it: a logging handler
notes the times of its own log lines "Beginning training" and "Finished Training" (the training loop),
and its runner's ``run`` is wrapped to read ``t_env`` (the env steps) after each call.

marl-q runs ``python -m marl_q.cli run SCENARIO --set ...`` from ``--tree``: the training loop is the
run's ``summary.json`` ``wall_s``; whole processes are timed from outside on both sides.

The pairs (``--pairs``; marl-q's file and its overrides, EPyMARL's config and task):

    lbf_mappo   scenarios/lbf_mappo.yaml (eval off)                  mappo  lbforaging:Foraging-8x8-2p-2f-coop-v3, 50 steps
    lbf_qmix    scenarios/spread_qmix.yaml, scenario: that LBF task   qmix   the same task
                (marl-q's LBF is its native one, scenario.name: lbf: lbforaging's episodes step for step)
    lbf_vdn     scenarios/spread_vdn.yaml, the same                   vdn    the same task
    lbf_iql     scenarios/spread_iql.yaml, the same                   iql    the same task
    lbf_vdn_recipe  scenarios/spread_qmix.yaml with algorithm.name=vdn: EPyMARL's VDN recipe (its qmix
                and vdn configs differ only in the mixer), the same   vdn    the same task
    lbf_iql_gru scenarios/spread_iql_gru.yaml (EPyMARL's IQL recipe: a GRU of 128), the same
                                                                      iql    the same task
    spread_qmix scenarios/spread_qmix.yaml                            qmix   pz-mpe-simple-spread-v3 (N=3, local_ratio 0.5), 25 steps
    spread_vdn  scenarios/spread_vdn.yaml                             vdn    the same task
    spread_iql  scenarios/spread_iql.yaml                             iql    the same task

Hyperparameters are each side's own (EPyMARL's: GRU agents of 128 units for mappo and iql, an MLP of
64 for qmix and vdn, whole-episode batches; marl-q's: its files). The return is the team return (the
agents' rewards summed over the episode; EPyMARL's ``common_reward`` with ``reward_scalarisation:
sum``), of training episodes: EPyMARL's logged ``return_mean`` nearest the budget (episodes of its last
``runner_log_interval`` = 10k env steps), marl-q's mean over the episodes ending in the last 10k.

Subcommands:

    check    both sides build the task: agents, observation and action sizes, episode length; the same
             start states and actions give the same observations and team rewards (LBF: the same lbforaging
             env reset with the same seed; spread: EPyMARL's PettingZoo positions set into marl-q's
             native spread, as analysis/peers/jaxmarl_spread.py does for JaxMARL)
    speed    ``--rounds`` interleaved rounds per pair of one run per side at ``--steps``, pinned to
             ``--cpu`` with one thread; env steps/s of the loop and of the whole process, medians, ratio
    returns  ``--seeds`` per pair and side at ``--steps`` (pinned, one thread, run one after the other);
             mean and 95% t-interval over seeds; EPyMARL's own TD loss and mean Q(s, a) taken, as it
             logged them, come with its runs (``loss_curve``, ``q_taken_mean_curve``). ``--sides`` runs one
             side only (speed and returns; default both)
    plot     ``--inputs`` (what speed/returns wrote, several files merged): the summary over all their
             runs, and the curves against env steps as ``--png``

Everything goes to ``--out`` (JSON) as well as stdout.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]
LBF = "lbforaging:Foraging-8x8-2p-2f-coop-v3"
SPREAD = "pz-mpe-simple-spread-v3"
LAST_STEPS = 10_000  # the returns' window: EPyMARL's runner_log_interval in envs/gymma.yaml
LBF_SCENARIO = f'scenario={{name: lbf, task: "{LBF.split(":")[1]}"}}'  # marl-q's native LBF (its engine: lbforaging, the same episodes)
PAIRS = {  # name: (marl-q file, its overrides, EPyMARL alg config, env key, time limit)
    "lbf_mappo": ("scenarios/lbf_mappo.yaml", ["run.eval_every=null"], "mappo", LBF, 50),
    "lbf_qmix": ("scenarios/spread_qmix.yaml", [LBF_SCENARIO], "qmix", LBF, 50),
    "lbf_vdn": ("scenarios/spread_vdn.yaml", [LBF_SCENARIO], "vdn", LBF, 50),
    "lbf_iql": ("scenarios/spread_iql.yaml", [LBF_SCENARIO], "iql", LBF, 50),
    "lbf_vdn_recipe": ("scenarios/spread_qmix.yaml", [LBF_SCENARIO, "algorithm.name=vdn"], "vdn", LBF, 50),
    "lbf_iql_gru": ("scenarios/spread_iql_gru.yaml", [LBF_SCENARIO], "iql", LBF, 50),
    "spread_qmix": ("scenarios/spread_qmix.yaml", [], "qmix", SPREAD, 25),
    "spread_vdn": ("scenarios/spread_vdn.yaml", [], "vdn", SPREAD, 25),
    "spread_iql": ("scenarios/spread_iql.yaml", [], "iql", SPREAD, 25),
}


def one_thread_env(**extra: str) -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                MPLBACKEND="Agg", PYTHONUNBUFFERED="1", **extra)


def timed(cmd: list[str], **kwargs) -> tuple[int, str, str, float, float]:
    """Run ``cmd``: exit code, stdout, stderr, wall seconds and CPU seconds (user + system) of the process
    and of every process of its own that it waited for (EPyMARL's env workers), from ``wait4``. CPU
    seconds are what a process got of a shared, loaded machine; wall seconds depend on the load."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, **kwargs)
        _pid, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return proc.returncode, out.read(), err.read(), wall, usage.ru_utime + usage.ru_stime


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


# ----------------------------------------------------------------------------- EPyMARL side (its venv)
def epymarl_child(workdir: str, argv: list[str]) -> None:
    """Run EPyMARL's src/main.py in this process, unchanged, timing its training loop by its own log lines."""
    import logging
    import runpy

    t0 = time.perf_counter()
    src = os.path.join(workdir, "src")
    sys.path.insert(0, src)
    os.chdir(workdir)
    marks: dict[str, float] = {}

    class Marks(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            msg = record.getMessage()
            for key in ("Beginning training", "Finished Training"):
                if msg.startswith(key) and key not in marks:
                    marks[key] = time.perf_counter()

    # sacred's logger for main.py's my_main, which run.py logs through (main.py's get_logger clears
    # the root logger's handlers when it is imported, not this one's)
    logging.getLogger("my_main").addHandler(Marks())
    import torch

    torch.set_num_threads(1)
    from runners import REGISTRY as runners

    counted = {"t_env": 0}
    for cls in set(runners.values()):
        def wrap(run, cls=cls):
            def counted_run(self, test_mode=False):
                out = run(self, test_mode=test_mode)
                if not test_mode:
                    counted["t_env"] = self.t_env
                return out
            return counted_run
        cls.run = wrap(cls.run)
    sys.argv = [os.path.join(src, "main.py"), *argv]
    runpy.run_path(os.path.join(src, "main.py"), run_name="__main__")
    infos = sorted(Path(workdir, "results", "sacred").glob("*/*/*/info.json"))
    info = json.loads(infos[-1].read_text()) if infos else {}
    ret = info.get("return_mean", [])
    ret_t = info.get("return_mean_T", [])
    print(json.dumps({"peer": "epymarl", "env_steps": counted["t_env"], "setup_s": marks["Beginning training"] - t0,
                      "train_s": marks["Finished Training"] - marks["Beginning training"],
                      "return_T": ret_t, "return": [r["value"] if isinstance(r, dict) else r for r in ret],
                      "torch": torch.__version__}), flush=True)


def check_child(key: str, time_limit: int, episodes: int, seed: int) -> None:
    """EPyMARL's gymma env for ``key``: its env_info, and ``episodes`` random episodes reset with seeds
    seed, seed+1, ...: observations, actions, per-agent rewards (common_reward off, so as to see each
    agent's), and for spread the PettingZoo positions at reset."""
    import numpy as np
    from envs import REGISTRY

    rng = np.random.default_rng(seed)
    out = []
    for ep in range(episodes):
        # a fresh env for each episode: lbforaging 2.0.0 reset twice with one seed starts from two states
        env = REGISTRY["gymma"](key=key, time_limit=time_limit, pretrained_wrapper=None, seed=seed + ep,
                                common_reward=False, reward_scalarisation="sum")
        info = env.get_env_info()
        obs, _ = env.reset(seed=seed + ep)
        rec = {"reset_seed": seed + ep, "obs": [np.stack(obs).tolist()], "actions": [], "rewards": [], "done": []}
        inner = env._env.unwrapped
        if hasattr(inner, "_env"):  # EPyMARL's PettingZooWrapper: the MPE world
            world = inner._env.unwrapped.world
            rec["p_pos"] = [e.state.p_pos.tolist() for e in world.agents + world.landmarks]
            rec["p_vel"] = [e.state.p_vel.tolist() for e in world.agents + world.landmarks]
        for _t in range(time_limit):
            avail = env.get_avail_actions()
            actions = [int(rng.choice(np.flatnonzero(a))) for a in avail]
            obs, reward, done, truncated, _ = env.step(actions)
            rec["actions"].append(actions)
            rec["obs"].append(np.stack(obs).tolist())
            rec["rewards"].append([float(r) for r in reward])
            rec["done"].append(bool(done or truncated))
            if done or truncated:
                break
        out.append(rec)
    print(json.dumps({"env_info": {k: v for k, v in info.items() if isinstance(v, (int, float))}, "episodes": out}))


# ----------------------------------------------------------------------------- marl-q side
def marlq_env_check(pair: str, recorded: dict, tree: Path) -> dict:
    """Replay EPyMARL's recorded episodes on marl-q's env of ``pair``: sizes, lengths, the largest
    observation and reward differences."""
    import numpy as np

    sys.path.insert(0, str(tree))
    marl_file, overrides, _alg, key, limit = PAIRS[pair]
    eps = recorded["episodes"]
    if key == SPREAD:
        from analysis.peers.jaxmarl_spread import compare_envs

        # EPyMARL's PettingZooWrapper ends the episode when PettingZoo empties its agent list at the
        # step limit, and then returns zero rewards and the previous observations: the last step is
        # compared apart
        head = [dict(ep, obs=ep["obs"][:-1], actions=ep["actions"][:-1], rewards=ep["rewards"][:-1]) for ep in eps]
        obs_err, rew_err = compare_envs({"episodes": head})
        from scenarios.spread_native import SpreadNative

        env = SpreadNative(N=3, local_ratio=0.5, max_cycles=limit)
        obs_size, n_actions, n_agents = env.observation_space("agent_0").shape[0], env.action_space("agent_0").n, env.n
        last_epymarl = [sum(ep["rewards"][-1]) for ep in eps]
        lengths = [len(ep["actions"]) for ep in eps]
        return {"obs_size": int(obs_size), "n_actions": int(n_actions), "n_agents": int(n_agents), "episode_lengths": sorted(set(lengths)),
                "max_obs_diff": obs_err, "max_reward_diff": rew_err, "compared_steps": limit - 1,
                "epymarl_last_step_team_reward": sorted(set(last_epymarl))}
    from marl_q.config import load_config
    from scenarios.lbf_native import lbf_env

    cfg = load_config(str(tree / marl_file), overrides)
    s = cfg.scenario
    obs_err = rew_err = 0.0
    lengths = []
    for ep in eps:
        env = lbf_env(s.task, s.common_reward, s.penalty, s.engine)  # what the lbf scenario builds, fresh as on EPyMARL's side
        agents = list(env.possible_agents)
        obs, _ = env.reset(seed=ep["reset_seed"])
        got = np.stack([obs[a] for a in agents])
        obs_err = max(obs_err, float(np.abs(got - np.asarray(ep["obs"][0])).max()))
        t = 0
        for t, actions in enumerate(ep["actions"]):
            obs, rew, term, trunc, _ = env.step({a: actions[i] for i, a in enumerate(agents)})
            if obs:
                got = np.stack([obs[a] for a in agents])
                obs_err = max(obs_err, float(np.abs(got - np.asarray(ep["obs"][t + 1])).max()))
            # the team reward (lbf_mappo.yaml's common_reward gives each agent the mean, not its own)
            rew_err = max(rew_err, abs(sum(rew[a] for a in agents) - sum(ep["rewards"][t])))
            if all(term[a] or trunc[a] for a in agents):
                break
        lengths.append(t + 1)
        if lengths[-1] != len(ep["actions"]):
            rew_err = float("inf")
    obs_size = env.observation_space(agents[0]).shape[0]
    return {"obs_size": int(obs_size), "n_actions": int(env.action_space(agents[0]).n), "n_agents": len(agents),
            "episode_lengths": sorted(set(lengths)), "max_obs_diff": obs_err, "max_reward_diff": rew_err,
            "compared_steps": "all"}


def run_marlq(tree: Path, pair: str, steps: int, seed: int, cpu: str, keep: Path | None = None) -> dict:
    marl_file, overrides, *_ = PAIRS[pair]
    with tempfile.TemporaryDirectory() as tmp:
        out = (keep or Path(tmp)) / "run"
        sets = [*overrides, f"run.total_env_steps={steps}", f"run.seed={seed}", "run.plots=false"]
        cmd = ["taskset", "-c", cpu, sys.executable, "-m", "marl_q.cli", "run", marl_file, "--quiet", "--out", str(out)]
        for s in sets:
            cmd += ["--set", s]
        code, _out, err, whole, cpu = timed(cmd, cwd=tree, env=one_thread_env(PYTHONPATH=str(tree)))
        if code:
            raise RuntimeError(f"marl-q run failed:\n{err[-3000:]}")
        summary = json.loads((out / "summary.json").read_text())
        with open(out / "metrics.csv") as f:
            rows = [(int(r["env_steps"]), float(r["return"])) for r in csv.DictReader(f)]
    end = rows[-1][0] if rows else 0
    last = [r for s, r in rows if s > end - LAST_STEPS]
    return {"peer": "marl-q", "pair": pair, "seed": seed, "whole_s": whole, "cpu_s": cpu, "train_s": summary["wall_s"],
            "env_steps": summary["env_steps"], "return_last": sum(last) / len(last) if last else None,
            "curve": rows_curve(rows)}


def rows_curve(rows: list[tuple[int, float]], every: int = LAST_STEPS) -> list[tuple[int, float]]:
    """Mean return of the episodes ending in each ``every`` env steps (EPyMARL's log interval)."""
    bins: dict[int, list[float]] = {}
    for s, r in rows:
        bins.setdefault((s - 1) // every, []).append(r)
    return [((b + 1) * every, sum(v) / len(v)) for b, v in sorted(bins.items())]


def run_epymarl(python: str, epymarl_dir: Path, work: Path, pair: str, steps: int, seed: int, cpu: str) -> dict:
    _f, _o, alg, key, limit = PAIRS[pair]
    workdir = Path(tempfile.mkdtemp(prefix=f"{pair}_s{seed}_", dir=work))
    shutil.copytree(epymarl_dir / "src", workdir / "src")
    batch = 10 if alg == "mappo" else 1  # batch_size_run of its alg config (parallel runner for mappo)
    argv = [f"--config={alg}", "--env-config=gymma", "with", f"env_args.key={key}", f"env_args.time_limit={limit}",
            f"seed={seed}", f"t_max={steps}", "use_cuda=False", f"test_interval={steps * 10}",
            f"test_nepisode={batch}"]
    cmd = ["taskset", "-c", cpu, python, str(HERE), "--child-epymarl", str(workdir), *argv]
    code, out, err, whole, cpu = timed(cmd, env=one_thread_env())
    lines = [ln for ln in out.splitlines() if ln.startswith('{"peer": "epymarl"')]
    if code or not lines:
        raise RuntimeError(f"EPyMARL run failed ({workdir}):\n{out[-2000:]}\n{err[-3000:]}")
    got = json.loads(lines[-1])
    shutil.rmtree(workdir / "src")
    got.update(learner_curves(workdir))
    got.update(pair=pair, seed=seed, whole_s=whole, cpu_s=cpu, workdir=str(workdir))
    got["return_last"] = got["return"][-1] if got["return"] else None
    got["curve"] = list(zip(got.pop("return_T"), got.pop("return")))
    return got


def learner_curves(workdir: Path) -> dict:
    """EPyMARL's own logged learner statistics (its sacred ``info.json``): the TD loss and the mean of
    Q(s, a) taken, each as [(env steps, value)], where it logged them."""
    out: dict = {}
    for info in workdir.glob("results/sacred/*/*/*/info.json"):
        logged = json.loads(info.read_text())
        for key in ("loss", "loss_td", "q_taken_mean"):
            if key in logged and f"{key}_T" in logged:
                vals = [v["value"] if isinstance(v, dict) else v for v in logged[key]]
                out[f"{key}_curve"] = [[int(t), float(v)] for t, v in zip(logged[f"{key}_T"], vals)]
    return out


def side_runs(runs: list[dict], pair: str, peer: str) -> list[dict]:
    """The runs of one side of a pair. EPyMARL's side depends only on its config and task (a pair's
    last three fields), so a pair whose EPyMARL runs are absent takes those of another pair with the
    same config and task (``lbf_vdn_recipe`` compares with ``lbf_vdn``'s EPyMARL runs)."""
    own = [g for g in runs if g["pair"] == pair and g["peer"] == peer]
    if own or peer != "epymarl" or pair not in PAIRS:
        return own
    same = PAIRS[pair][2:]
    return [g for g in runs if g["peer"] == "epymarl" and g["pair"] in PAIRS and PAIRS[g["pair"]][2:] == same]


def summarize(runs: list[dict], only: list[str] | None = None) -> dict:
    """Per pair (those of the runs, or ``only``): each side's median env steps/s (loop, whole process),
    their ratio (and the ratio of each run pair), and the team returns' mean and 95% t-interval over the
    runs; printed as well."""
    from analysis.stats import mean_ci  # marl-q's side only: not in EPyMARL's venv

    pairs = only if only is not None else list(dict.fromkeys(g["pair"] for g in runs))
    summary = {}
    for pair in pairs:
        by = {p: side_runs(runs, pair, p) for p in ("epymarl", "marl-q")}
        s = summary[pair] = {}
        for key in ("loop_steps_per_s", "whole_steps_per_s", "cpu_steps_per_s"):
            if not by["epymarl"] or not by["marl-q"] or not all(key in g for g in by["epymarl"] + by["marl-q"]):
                continue
            e = statistics.median(g[key] for g in by["epymarl"])
            m = statistics.median(g[key] for g in by["marl-q"])
            ratios = [mq[key] / ep[key] for mq, ep in zip(by["marl-q"], by["epymarl"])]
            s[key] = {"epymarl": e, "marl-q": m, "ratio_of_medians": m / e, "ratios": ratios}
            print(f"{pair} {key}: EPyMARL median {e:,.0f}, marl-q median {m:,.0f}, marl-q/EPyMARL {m / e:.2f} "
                  f"(per run {[round(x, 2) for x in ratios]})")
        for peer in ("epymarl", "marl-q"):
            vals = [g["return_last"] for g in by[peer] if g["return_last"] is not None]
            if vals:
                mean, hw = (float(x) for x in mean_ci(vals))
                s[f"return_{peer}"] = {"mean": mean, "ci95": hw, "n": len(vals), "values": vals}
                print(f"{pair} team return {peer}: {mean:.3f} ± {hw:.3f} (95% t, {len(vals)} runs: "
                      f"{[round(v, 3) for v in vals]})")
    return summary


def plot(reports: list[dict], path: Path, only: list[str] | None = None) -> Path:
    """Team return against env steps, one panel per pair: each side's mean over seeds of its 10k-step
    means (EPyMARL's logged ``return_mean``, marl-q's bins of the same width), with the 95% t band."""
    import numpy as np

    from analysis.plots import band_text, mean_band, new_figure, save_figure, wrap

    runs = [dict(g, budget=rep["steps"]) for rep in reports for g in rep["runs"]]
    pairs = [p for p in dict.fromkeys(g["pair"] for g in runs) if only is None or p in only]
    pairs += [p for p in (only or []) if p not in pairs and p in PAIRS and side_runs(runs, p, "epymarl")]
    fig, axes = new_figure((6.0 * len(pairs), 4.6), ncols=len(pairs))
    for ax, pair in zip(axes[0], pairs):
        steps = max(g["budget"] for peer in ("epymarl", "marl-q") for g in side_runs(runs, pair, peer))
        grid = np.arange(LAST_STEPS, steps + 1, LAST_STEPS, dtype=float)
        counts = []
        for peer, name in (("epymarl", "EPyMARL cbc38c0"), ("marl-q", "marl-q")):
            curves = []
            for g in side_runs(runs, pair, peer):
                x, y = (np.asarray(v, dtype=float) for v in zip(*g["curve"]))
                c = np.interp(grid, x, y)
                c[(grid < x[0] - LAST_STEPS / 2) | (grid > x[-1] + LAST_STEPS / 2)] = np.nan
                curves.append(c)
            if not curves:
                continue
            counts.append(len(curves))
            mean, lo, hi = mean_band(curves)
            line, = ax.plot(grid, mean, marker=".", label=f"{name} ({len(curves)} seeds)")
            if len(curves) > 1:
                ax.fill_between(grid, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
        _f, overrides, alg, key, limit = PAIRS[pair]
        shown = [o for o in overrides if not o.startswith("scenario=")]  # the task is in the title already
        ax.set_xlabel("environment steps")
        ax.set_ylabel(f"team return (agents' rewards summed over the episode),\nmean of the episodes in each {LAST_STEPS // 1000}k env steps")
        ax.set_title(wrap(f"{alg.upper()} on {key.split(':')[-1]} ({limit}-step episodes), {steps:,} env steps "
                          f"a run: EPyMARL's {alg}.yaml against marl-q's {PAIRS[pair][0].split('/')[-1]}"
                          f"{' (' + ', '.join(shown) + ')' if shown else ''}, "
                          "training episodes", 62), fontsize=9)
        band = band_text(counts)
        if ax is not axes[0][-1]:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8, title=band, title_fontsize=7)
    fig.suptitle("marl-q against EPyMARL (cbc38c0) on the same task, one core and one thread each", fontsize=10)
    return save_figure(fig, axes[0][-1], path, legend_title=band_text(counts))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="?", choices=["check", "speed", "returns", "plot"])
    parser.add_argument("--epymarl-dir", default=os.environ.get("EPYMARL_DIR"),
                        help="an EPyMARL checkout (git clone https://github.com/uoe-agents/epymarl; cbc38c0); env EPYMARL_DIR")
    parser.add_argument("--epymarl-python", default="/tmp/venv_epymarl/bin/python")
    parser.add_argument("--tree", default=str(ROOT), help="the marl-q checkout to run")
    parser.add_argument("--work", default="/tmp/epymarl_work", help="EPyMARL's run folders")
    parser.add_argument("--pairs", help=f"comma-separated, of {', '.join(PAIRS)} (default lbf_mappo,lbf_qmix; "
                        "plot: every pair in the inputs)")
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--cpu", default="1")
    parser.add_argument("--sides", default="epymarl,marl-q",
                        help="speed/returns: which sides to run (comma-separated: epymarl, marl-q)")
    parser.add_argument("--episodes", type=int, default=20, help="check: episodes replayed per task")
    parser.add_argument("--out", help="write every run's figures here (JSON)")
    parser.add_argument("--inputs", nargs="+", help="plot: the JSON files that returns wrote (--out)")
    parser.add_argument("--png", help="plot: the figure to write")
    parser.add_argument("--child-epymarl", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.add_argument("--child-check", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_epymarl:
        epymarl_child(args.child_epymarl[0], args.child_epymarl[1:])
        return 0
    if args.child_check:
        key, limit, episodes, seed = args.child_check
        sys.path.insert(0, os.path.join(os.environ["EPYMARL_SRC"]))
        check_child(key, int(limit), int(episodes), int(seed))
        return 0
    if args.what is None:
        print("epymarl_compare: say what to run: check, speed, returns or plot", file=sys.stderr)
        return 2
    if args.what == "plot":
        if not args.inputs or not args.png:
            print("epymarl_compare: plot needs --inputs (returns JSONs of --out) and --png", file=sys.stderr)
            return 2
        only = [p for p in args.pairs.split(",") if p] if args.pairs else None
        unknown = [p for p in only or [] if p not in PAIRS]
        if unknown:
            print(f"epymarl_compare: --pairs: unknown {', '.join(unknown)} (choices: {', '.join(PAIRS)})", file=sys.stderr)
            return 2
        reports = [json.loads(Path(p).read_text()) for p in args.inputs]
        summarize([g for rep in reports for g in rep["runs"]], only)
        for rep in reports:
            print(f"{rep.get('uptime_before')}  ..  {rep.get('uptime_after')}")
        print(plot(reports, Path(args.png), only))
        return 0
    pairs = [p for p in (args.pairs or "lbf_mappo,lbf_qmix").split(",") if p]
    unknown = [p for p in pairs if p not in PAIRS]
    if unknown or not pairs:
        print(f"epymarl_compare: --pairs: unknown {', '.join(unknown) or '(none given)'} (choices: {', '.join(PAIRS)})",
              file=sys.stderr)
        return 2
    if not args.epymarl_dir or not (Path(args.epymarl_dir) / "src" / "main.py").is_file():
        print(f"epymarl_compare: --epymarl-dir (or EPYMARL_DIR) must name an EPyMARL checkout with src/main.py, "
              f"got {args.epymarl_dir!r}", file=sys.stderr)
        return 2
    if not Path(args.epymarl_python).is_file():
        print(f"epymarl_compare: --epymarl-python {args.epymarl_python}: no such file (analysis/peers/epymarl.sh builds it)",
              file=sys.stderr)
        return 2
    if args.steps < 1 or args.rounds < 1:
        print("epymarl_compare: --steps and --rounds must be positive", file=sys.stderr)
        return 2
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        print(f"epymarl_compare: --seeds must be comma-separated integers, got {args.seeds!r}", file=sys.stderr)
        return 2
    sides = [p for p in args.sides.split(",") if p]
    if not sides or any(p not in ("epymarl", "marl-q") for p in sides):
        print(f"epymarl_compare: --sides must name epymarl and/or marl-q, got {args.sides!r}", file=sys.stderr)
        return 2
    tree = Path(args.tree).resolve()
    epymarl_dir = Path(args.epymarl_dir).resolve()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    report: dict = {"what": args.what, "steps": args.steps, "tree": str(tree), "uptime_before": uptime()}
    print(report["uptime_before"], flush=True)

    if args.what == "check":
        report["check"] = {}
        for pair in pairs:
            _f, _o, _a, key, limit = PAIRS[pair]
            proc = subprocess.run([args.epymarl_python, str(HERE), "--child-check", key, str(limit), str(args.episodes), "0"],
                                  env=one_thread_env(EPYMARL_SRC=str(epymarl_dir / "src")), capture_output=True, text=True)
            if proc.returncode:
                print(f"epymarl_compare: the env check failed in EPyMARL's venv:\n{proc.stderr[-3000:]}", file=sys.stderr)
                return 1
            rec = json.loads(proc.stdout.splitlines()[-1])
            mq = marlq_env_check(pair, rec, tree)
            ep = rec["env_info"]
            returns = [sum(map(sum, e["rewards"])) for e in rec["episodes"]]
            line = {"epymarl": {"obs_size": ep["obs_shape"], "n_actions": ep["n_actions"], "n_agents": ep["n_agents"],
                                "episode_limit": ep["episode_limit"], "state_size": ep["state_shape"],
                                "episode_lengths": sorted({len(e["actions"]) for e in rec["episodes"]}),
                                "random_team_return_mean": sum(returns) / len(returns),
                                "steps_with_a_reward": sum(any(r) for e in rec["episodes"] for r in e["rewards"])},
                    "marl-q": mq}
            report["check"][pair] = line
            print(f"{pair}: EPyMARL {json.dumps(line['epymarl'])}\n{'':{len(pair)}}  marl-q  {json.dumps(mq)}", flush=True)
    else:
        runs: list[dict] = []
        if args.what == "speed":
            plan = [(r, pair, args.seeds and seeds[0]) for r in range(args.rounds) for pair in pairs]
        else:
            plan = [(0, pair, s) for pair in pairs for s in seeds]
        for r, pair, seed in plan:
            for peer in sides:
                got = (run_epymarl(args.epymarl_python, epymarl_dir, work, pair, args.steps, seed, args.cpu)
                       if peer == "epymarl" else run_marlq(tree, pair, args.steps, seed, args.cpu))
                got["round"] = r
                got["loop_steps_per_s"] = got["env_steps"] / got["train_s"]
                got["whole_steps_per_s"] = got["env_steps"] / got["whole_s"]
                got["cpu_steps_per_s"] = got["env_steps"] / got["cpu_s"]
                print(f"{pair} round {r} seed {seed} {peer:7}: {got['env_steps']} env steps, loop {got['train_s']:.1f} s "
                      f"({got['loop_steps_per_s']:,.0f}/s), whole {got['whole_s']:.1f} s ({got['whole_steps_per_s']:,.0f}/s), "
                      f"CPU {got['cpu_s']:.1f} s ({got['cpu_steps_per_s']:,.0f}/s), "
                      f"team return (last {LAST_STEPS // 1000}k steps) {got['return_last']}", flush=True)
                runs.append(got)
                if args.out:  # after every run, so that a stopped comparison keeps what it measured
                    Path(args.out).write_text(json.dumps(dict(report, runs=runs), indent=1))
        report["runs"] = runs
        report["uptime_after"] = uptime()
        print(report["uptime_after"])
        report["summary"] = summarize(runs)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
