"""Does a COMA critic know which action is better? Its counterfactual advantages against Monte Carlo.

COMA's actor follows A^a(u') = Q(s,(u^-a,u')) - sum_u pi^a(u) Q(s,(u^-a,u)); if the critic's
per-action differences are wrong, the actor climbs to the critic's argmax, which is the collapse seen
on simple_spread. This tool measures that directly from a run directory and one of its checkpoints:

1. play the run's scenario with the checkpoint's actor (its epsilon floor at that point) and stop at
   a random step t < ``max_t`` of each of ``states`` episodes; the joint action u is drawn there;
2. for each agent a and each alternative u', estimate Q^pi(s,(u^-a,u')) by ``rollouts`` Monte Carlo
   continuations of a copy of the env (the discounted team return to the episode's end, actions
   drawn from the same actor);
3. compare the critic's advantages with the Monte Carlo ones: correlation, agreement of the argmax,
   how often each favours the no-op action (0), and the mean advantage per action; and the Monte
   Carlo estimate with itself (two halves of the rollouts, Spearman-Brown corrected): the square root
   of that reliability is the correlation a perfect critic would show, given the rollouts' noise.

The Monte Carlo returns are truncated at the episode's end while the critic bootstraps past it, so
levels differ; advantages (differences at one state) are what is compared. The estimate carries
noise of roughly std(G)/sqrt(rollouts); the split-half figure measures how much.

    python -m analysis.coma_critic RUN_DIR [--checkpoint PATH] [--states 40] [--rollouts 8]

Needs a ``coma`` run (the critic with per-action outputs) on a scenario whose env can be deep-copied.
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from marl_q.errors import UserError
from marl_q.seeding import coma_critic_probe_seed

PolicyFn = Callable[[dict[str, Any]], np.ndarray]  # observations dict -> (A, U) action probabilities


def draw(pi: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One action per row of ``pi`` (rows need not be normalised exactly)."""
    return np.array([rng.choice(pi.shape[1], p=row / row.sum()) for row in pi])


def mc_returns(env: Any, obs: dict[str, Any], joint: np.ndarray, agent: int, policy: PolicyFn,
               team: Callable[[dict[str, float]], float], gamma: float, rollouts: int,
               rng: np.random.Generator) -> np.ndarray:
    """(rollouts, U): for every action u' of ``agent`` at the env's current state, the discounted team
    return from this step to the episode's end of each of ``rollouts`` copies of the env, with
    ``joint`` (agent's slot replaced by u') first and ``policy`` after."""
    n_actions = policy(obs).shape[1]
    out = np.zeros((rollouts, n_actions))
    for alt in range(n_actions):
        first = joint.copy()
        first[agent] = alt
        for k in range(rollouts):
            sim = copy.deepcopy(env)
            agents = list(sim.agents)
            acts, disc = first, 1.0
            while sim.agents:
                step_obs, rewards, *_ = sim.step({a: int(acts[i]) for i, a in enumerate(agents)})
                out[k, alt] += disc * team(rewards)
                disc *= gamma
                if not sim.agents:
                    break
                acts = draw(policy(step_obs), rng)
    return out


def mc_action_values(env: Any, obs: dict[str, Any], joint: np.ndarray, agent: int, policy: PolicyFn,
                     team: Callable[[dict[str, float]], float], gamma: float, rollouts: int,
                     rng: np.random.Generator) -> np.ndarray:
    """Monte Carlo Q^pi(s, (u^-a, u')) for every action u' of ``agent``: the mean of ``mc_returns``."""
    return mc_returns(env, obs, joint, agent, policy, team, gamma, rollouts, rng).mean(axis=0)


def compare(critic_adv: np.ndarray, mc_adv: np.ndarray, halves: Optional[tuple[np.ndarray, np.ndarray]] = None
            ) -> dict[str, Any]:
    """Agreement of two (n, U) arrays of per-action advantages. ``halves``: the Monte Carlo advantages
    from two disjoint halves of the rollouts. Their correlation, Spearman-Brown corrected to the full
    count, is the reliability R of the Monte Carlo estimate; a critic equal to the true advantage would
    correlate with it at about sqrt(R) (``mc_ceiling``), so that is the most the check can show."""
    reliability = ceiling = None
    if halves is not None:
        r = float(np.corrcoef(halves[0].ravel(), halves[1].ravel())[0, 1])
        reliability = 2 * r / (1 + r) if r > -1 else -1.0
        ceiling = float(np.sqrt(max(reliability, 0.0)))
    return {
        "mc_reliability": reliability,
        "mc_ceiling": ceiling,
        "pairs": int(critic_adv.shape[0]),
        "correlation": float(np.corrcoef(critic_adv.ravel(), mc_adv.ravel())[0, 1]),
        "argmax_agreement": float(np.mean(critic_adv.argmax(1) == mc_adv.argmax(1))),
        "critic_argmax_noop": float(np.mean(critic_adv.argmax(1) == 0)),
        "mc_argmax_noop": float(np.mean(mc_adv.argmax(1) == 0)),
        "critic_std": float(critic_adv.std()),
        "mc_std": float(mc_adv.std()),
        "critic_mean_by_action": critic_adv.mean(0).round(3).tolist(),
        "mc_mean_by_action": mc_adv.mean(0).round(3).tolist(),
    }


def check_run(run_dir: Path, checkpoint: Optional[Path] = None, states: int = 40, rollouts: int = 8,
              max_t: int = 8, seed: int = 0) -> dict[str, Any]:
    """The comparison for one coma run at one checkpoint (the latest by default)."""
    from agents.coma import make_env, stack_obs, team_reward
    from agents.coma_learner import critic_forward
    from marl_q.rundir import load_trained

    for name, value in (("states", states), ("rollouts", rollouts), ("max_t", max_t)):
        if value < 1:
            raise UserError(f"{name}: must be at least 1, got {value}")
    trained = load_trained(Path(run_dir), Path(checkpoint) if checkpoint is not None else None)
    cfg = trained.cfg
    if cfg.algorithm.name != "coma":
        raise UserError(f"{run_dir}: algorithm {cfg.algorithm.name!r} has no per-action critic; this check needs coma")
    hp, desc, epsilon = cfg.algorithm.params, trained.info["desc"], trained.info["epsilon"]
    agents, n_actions = desc.agents, desc.dims.n_actions
    critic = trained.models["critic"]

    def policy(obs_d: dict[str, Any]) -> np.ndarray:
        probs = trained.probs(obs_d)
        return np.stack([probs[a] for a in agents])

    def team(rewards: dict[str, float]) -> float:
        return team_reward(rewards, agents, hp.team_reward)

    rng = np.random.default_rng(seed)
    env = make_env(cfg, coma_critic_probe_seed(cfg.run.seed))
    critic_rows, mc_rows, half_rows = [], [], ([], [])
    half = rollouts // 2
    for episode in range(states):
        obs_d, _ = env.reset(seed=coma_critic_probe_seed(cfg.run.seed, episode))
        stop = int(rng.integers(0, max_t))
        for _ in range(stop):
            if not env.agents:
                break
            obs_d, *_ = env.step({a: int(u) for a, u in zip(agents, draw(policy(obs_d), rng))})
        if not env.agents:
            continue
        pi = policy(obs_d)
        joint = draw(pi, rng)
        obs = torch.from_numpy(stack_obs(obs_d, agents, desc.dims.obs_dim))
        state = torch.from_numpy(np.asarray(env.state(), dtype=np.float32).reshape(-1))
        with torch.no_grad():
            q = critic_forward("coma", critic, state[None], obs[None], torch.from_numpy(joint)[None],
                               n_actions)[0].numpy().astype(np.float64)
        for a in range(len(agents)):
            returns = mc_returns(env, obs_d, joint, a, policy, team, hp.gamma, rollouts, rng)
            mc = returns.mean(axis=0)
            critic_rows.append(q[a] - pi[a] @ q[a])
            mc_rows.append(mc - pi[a] @ mc)
            if half:
                for rows, part in zip(half_rows, (returns[:half].mean(0), returns[half:2 * half].mean(0))):
                    rows.append(part - pi[a] @ part)
    env.close()
    if not critic_rows:
        raise UserError(f"max_t {max_t}: every sampled episode ended before the stop step")
    halves = (np.array(half_rows[0]), np.array(half_rows[1])) if half else None
    out = compare(np.array(critic_rows), np.array(mc_rows), halves)
    out.update(run=str(run_dir), checkpoint=str(trained.checkpoint), env_steps=int(trained.info["env_steps"]), epsilon=epsilon,
               rollouts=rollouts)
    return out


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--checkpoint", type=Path, default=None, help="a ckpt_*.npz (default: the latest)")
    parser.add_argument("--states", type=int, default=40, help="episodes, one state taken from each")
    parser.add_argument("--rollouts", type=int, default=8, help="Monte Carlo continuations per action")
    parser.add_argument("--max-t", type=int, default=8, help="states are taken at a step below this")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        r = check_run(args.run_dir, args.checkpoint, args.states, args.rollouts, args.max_t, args.seed)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{r['run']} at {r['env_steps']} env steps (epsilon {r['epsilon']:.3f}), {r['pairs']} agent-states, "
          f"{r['rollouts']} rollouts per action")
    print(f"  correlation of the critic's advantages with Monte Carlo: {r['correlation']:.3f} "
          f"(std {r['critic_std']:.2f} vs {r['mc_std']:.2f})")
    if r["mc_reliability"] is not None:
        print(f"  Monte Carlo reliability (split halves, corrected to {r['rollouts']} rollouts): "
              f"{r['mc_reliability']:.3f}; a perfect critic would show a correlation of about {r['mc_ceiling']:.3f}")
    print(f"  same best action: {r['argmax_agreement']:.2f}; best is no-op: critic {r['critic_argmax_noop']:.2f}, "
          f"Monte Carlo {r['mc_argmax_noop']:.2f}")
    print(f"  mean advantage by action: critic {r['critic_mean_by_action']}, Monte Carlo {r['mc_mean_by_action']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
