"""Peer benchmark: BenchMARL MAPPO / IPPO on PettingZoo simple_spread_v3.

Runs ONE (algorithm, seed) per invocation inside the BenchMARL virtualenv
(see benchmarl_spread.sh, which builds that venv and chains the runs).  It only
calls the installed ``benchmarl`` package through its public Python API
(Experiment, ExperimentConfig, MappoConfig/IppoConfig, PettingZooTask,
MlpConfig) and writes one JSON summary per run.

Settings
  * task: PettingZoo simple_spread_v3, N=3, max_cycles=25, local_ratio=0.5,
    discrete actions (``prefer_continuous_actions=False``).
  * hyperparameters: BenchMARL's own packaged yaml defaults
    (benchmarl/conf/experiment/base_experiment.yaml, conf/algorithm/{mappo,ippo}.yaml,
    conf/model/layers/mlp.yaml; BenchMARL ships no MPE-specific fine-tuned set),
    except: max_n_frames, devices=cpu, evaluation/render off, loggers=[csv],
    no checkpoints, and optionally frames_per_batch / n_envs via CLI flags.
  * torch.set_num_threads(1).

Return scales (both are undiscounted episode sums over the 25 steps)
  * per_agent_mean: episode return summed over time, averaged over the 3 agents
    (what BenchMARL logs as collection/reward/episode_reward_mean).
  * team_sum: the same summed over the 3 agents (= 3 * per_agent_mean here).

Returns come from the training (collection) rollouts, i.e. the stochastic
policy, read with a BenchMARL Callback at every collected batch.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except Exception as e:  # pragma: no cover
        return f"uptime failed: {e}"



import torch  # noqa: E402  (module level so the callback class is picklable)
from benchmarl.experiment.callback import Callback  # noqa: E402


class EpisodeReturns(Callback):
    """Reads per-episode, per-agent returns from each collected batch.

    Defined at module level because BenchMARL pickles its callbacks.
    """

    def __init__(self):
        super().__init__()
        self.episodes = []  # list of (frames_at_end_of_batch, [return of agent i])
        self.batches = []  # one summary per collected batch
        self.frames = 0
        self.t_run0 = time.time()

    def on_batch_collected(self, batch):
        self.frames += batch.numel()
        done = batch.get(("next", "done")).squeeze(-1)  # (n_envs, T)
        rows = []
        for group in self.experiment.group_map.keys():
            ep = batch.get(("next", group, "episode_reward"))  # (n_envs, T, n_agents, 1)
            rows.append(ep.squeeze(-1)[done])  # (n_episodes, n_agents)
        per_ep = torch.cat(rows, dim=-1).double().tolist()
        for r in per_ep:
            self.episodes.append((self.frames, r))
        n = len(per_ep)
        pam = sum(sum(r) / len(r) for r in per_ep) / n if n else None
        ts = sum(sum(r) for r in per_ep) / n if n else None
        self.batches.append({
            "frames": self.frames,
            "n_episodes": n,
            "per_agent_mean_return": pam,
            "team_sum_return": ts,
            "wall_s_since_start": time.time() - self.t_run0,
        })


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--algo", choices=["mappo", "ippo"], required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--frames", type=int, default=300_000)
    ap.add_argument("--frames-per-batch", type=int, default=None,
                    help="on_policy_collected_frames_per_batch (default: BenchMARL yaml)")
    ap.add_argument("--n-envs", type=int, default=None,
                    help="on_policy_n_envs_per_worker (default: BenchMARL yaml)")
    ap.add_argument("--final-episodes", type=int, default=100,
                    help="final return = mean over the last K collected episodes")
    ap.add_argument("--out", default="/work/peers/out")
    ap.add_argument("--tag", default="", help="suffix for output names (e.g. _smoke)")
    ap.add_argument("--pip-freeze", default=None,
                    help="file with `pip freeze` of the venv to embed in the JSON")
    args = ap.parse_args()

    uptime_before = uptime()
    t_script0 = time.time()

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass

    import benchmarl
    import tensordict
    import torchrl
    from benchmarl.algorithms import IppoConfig, MappoConfig
    from benchmarl.environments import PettingZooTask
    from benchmarl.experiment import Experiment, ExperimentConfig
    from benchmarl.models.mlp import MlpConfig

    name = f"{args.algo}_s{args.seed}{args.tag}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    save_folder = out / f"bm_{name}"
    save_folder.mkdir(parents=True, exist_ok=True)

    # ---- task -------------------------------------------------------------
    task = PettingZooTask.SIMPLE_SPREAD.get_from_yaml()
    task.config.update({"N": 3, "max_cycles": 25, "local_ratio": 0.5})

    # ---- algorithm / model: BenchMARL yaml defaults -------------------------
    algo_cfg = (MappoConfig if args.algo == "mappo" else IppoConfig).get_from_yaml()
    model_cfg = MlpConfig.get_from_yaml()
    critic_model_cfg = MlpConfig.get_from_yaml()

    # ---- experiment: yaml defaults + documented overrides ------------------
    exp_cfg = ExperimentConfig.get_from_yaml()
    overrides = {
        "sampling_device": "cpu",
        "train_device": "cpu",
        "buffer_device": "cpu",
        "prefer_continuous_actions": False,  # discrete actions
        "max_n_frames": args.frames,
        "max_n_iters": None,
        "evaluation": False,
        "render": False,
        "loggers": ["csv"],
        "create_json": False,
        "save_folder": str(save_folder),
        "checkpoint_interval": 0,
        "checkpoint_at_end": False,
    }
    if args.frames_per_batch is not None:
        overrides["on_policy_collected_frames_per_batch"] = args.frames_per_batch
    if args.n_envs is not None:
        overrides["on_policy_n_envs_per_worker"] = args.n_envs
    for k, v in overrides.items():
        setattr(exp_cfg, k, v)

    cb = EpisodeReturns()

    t_build0 = time.time()
    experiment = Experiment(
        task=task,
        algorithm_config=algo_cfg,
        model_config=model_cfg,
        critic_model_config=critic_model_cfg,
        seed=args.seed,
        config=exp_cfg,
        callbacks=[cb],
    )
    build_s = time.time() - t_build0
    t_run0 = time.time()
    cb.t_run0 = t_run0
    experiment.run()
    run_s = time.time() - t_run0
    wall_s = time.time() - t_script0
    uptime_after = uptime()

    # ---- BenchMARL's own CSV timers (collection-only rate) ------------------
    csv_dirs = [p for p in save_folder.rglob("scalars") if p.is_dir()]

    def read_scalar(key: str):
        for d in csv_dirs:
            f = d / f"{key.replace('/', '_')}.csv"
            if f.exists():
                vals = []
                with open(f) as fh:
                    for row in csv.reader(fh):
                        try:
                            vals.append((int(float(row[0])), float(row[1])))
                        except (ValueError, IndexError):
                            pass
                return vals
        return None

    coll = read_scalar("timers/collection_time")
    train = read_scalar("timers/training_time")
    iters = read_scalar("timers/iteration_time")
    bm_curve = read_scalar("collection/reward/episode_reward_mean")
    frames = cb.frames
    collection_s = sum(v for _, v in coll) if coll else None
    training_s = sum(v for _, v in train) if train else None
    iteration_s = sum(v for _, v in iters) if iters else None

    K = args.final_episodes
    last = [r for _, r in cb.episodes[-K:]]
    final_pam = sum(sum(r) / len(r) for r in last) / len(last) if last else None
    final_ts = sum(sum(r) for r in last) / len(last) if last else None
    last_batch = cb.batches[-1] if cb.batches else {}

    freeze = None
    if args.pip_freeze and os.path.exists(args.pip_freeze):
        freeze = Path(args.pip_freeze).read_text().splitlines()

    def cfg_dict(c):
        d = {}
        for k, v in vars(c).items():
            d[k] = v if isinstance(v, (int, float, str, bool, list, dict, type(None))) else repr(v)
        return d

    result = {
        "peer": "BenchMARL",
        "algorithm": args.algo,
        "seed": args.seed,
        "task": {"env": "pettingzoo/simple_spread_v3", **task.config,
                 "continuous_actions": False},
        "frames": frames,
        "frames_note": "BenchMARL frames = environment steps (one joint step of all 3 agents in one env copy)",
        "wall_s": wall_s,
        "wall_s_note": "whole script: imports + Experiment construction + experiment.run()",
        "build_s": build_s,
        "run_s": run_s,
        "env_steps_per_s": frames / wall_s,
        "env_steps_per_s_run_only": frames / run_s,
        "collection_s": collection_s,
        "training_s": training_s,
        "iteration_s_sum": iteration_s,
        "collection_env_steps_per_s": (frames / collection_s) if collection_s else None,
        "collection_note": "from BenchMARL's CSV timers/collection_time (sum over iterations)",
        "final_return": {
            "definition": f"mean over the last {len(last)} collected (training, stochastic-policy) episodes",
            "n_episodes": len(last),
            "per_agent_mean": final_pam,
            "team_sum": final_ts,
        },
        "final_return_last_iteration": {
            "definition": "mean over episodes completed in the last collected batch",
            "n_episodes": last_batch.get("n_episodes"),
            "per_agent_mean": last_batch.get("per_agent_mean_return"),
            "team_sum": last_batch.get("team_sum_return"),
        },
        "curve": cb.batches,
        "curve_note": "one point per collected batch (iteration); returns = mean over episodes finished in that batch",
        "benchmarl_csv_episode_reward_mean": bm_curve,
        "n_episodes_total": len(cb.episodes),
        "hyperparameters": {
            "source": "BenchMARL packaged yaml defaults (conf/experiment/base_experiment.yaml, "
                      f"conf/algorithm/{args.algo}.yaml, conf/model/layers/mlp.yaml) + overrides",
            "overrides": overrides,
            "experiment": cfg_dict(exp_cfg),
            "algorithm": cfg_dict(algo_cfg),
            "model": cfg_dict(model_cfg),
            "critic_model": cfg_dict(critic_model_cfg),
        },
        "torch_threads": torch.get_num_threads(),
        "versions": {
            "python": sys.version,
            "benchmarl": benchmarl.__version__,
            "torch": torch.__version__,
            "torchrl": torchrl.__version__,
            "tensordict": tensordict.__version__,
            "platform": platform.platform(),
        },
        "pip_freeze": freeze,
        "uptime_before": uptime_before,
        "uptime_after": uptime_after,
        "save_folder": str(save_folder),
    }
    out_json = out / f"{name}.json"
    out_json.write_text(json.dumps(result, indent=1))
    print(f"[benchmarl_spread] wrote {out_json}")
    print(f"[benchmarl_spread] frames={frames} wall_s={wall_s:.1f} "
          f"steps/s={frames / wall_s:.1f} collection steps/s="
          f"{result['collection_env_steps_per_s']} final per-agent={final_pam} team={final_ts}")


if __name__ == "__main__":
    main()
