"""Teams of agents, and the per-team and per-agent returns of every episode (returns.csv).

``scenario.teams`` maps each agent of a multi-agent env to one team, by a list of agent names
(``{good: [agent_0, agent_1], adv: [adversary_0]}``) or by a name prefix (``{good: "agent_", adv:
"adversary_"}``). Without it, PettingZoo MPE's prefixes (``adversary_``, ``agent_``) make the teams
when every agent carries one of them (simple_adversary, simple_tag, simple_spread), else every agent
is in one team, ``all``. A team's members are kept in the env's agent order.

A team's episode return is the sum of its members' returns (each the agent's rewards summed over the
episode). ``return`` in metrics.csv and eval.csv is the return of the team named by
``run.report_team`` (default: the first team); with one team that is every agent's reward summed,
as before teams existed. A run with more than one team also gets a ``return:<team>`` column per team
in metrics.csv (and ``eval_return:<team>`` in eval.csv); a run with one team keeps its columns.

returns.csv (every run of a learner that reports per-agent returns): one row per finished episode,
the same ``t, worker, env_steps, episode`` as its metrics.csv row, then ``team:<team>`` for each team
and ``agent:<agent>`` for each agent. It is cut back to a checkpoint on resume as metrics.csv is.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from marl_q.errors import ConfigError
from marl_q.rundir import FileLog

MPE_PREFIXES = ("adversary_", "agent_")  # PettingZoo MPE's agent names: adversary_0, agent_0, ...
EVERYONE = "all"  # the one team's name when no prefix sorts the agents
RETURNS_FILE = "returns.csv"
AGENT_RETURNS = "agent_returns"  # the episode row's key for its per-agent returns (env agent order)


def team_column(team: str) -> str:
    """metrics.csv's column of a team's return (runs with more than one team)."""
    return f"return:{team}"


@dataclass(frozen=True)
class Teams:
    """The run's agents (env order), each team's members (indices into ``agents``, in that order) and
    the team whose return is ``return``."""

    agents: tuple[str, ...]
    members: dict[str, tuple[int, ...]]
    report: str

    @property
    def names(self) -> list[str]:
        return list(self.members)

    @property
    def several(self) -> bool:
        return len(self.members) > 1

    def metric_fields(self) -> list[str]:
        """The per-team columns metrics.csv gets: none with one team (its bytes stay as they were)."""
        return [team_column(t) for t in self.names] if self.several else []

    def returns_fields(self) -> list[str]:
        return [f"team:{t}" for t in self.names] + [f"agent:{a}" for a in self.agents]

    def team_returns(self, agent_returns: Sequence[float]) -> dict[str, float]:
        """Each team's return: its members' returns summed in agent order."""
        if len(agent_returns) != len(self.agents):
            raise ValueError(f"{len(agent_returns)} agent returns for {len(self.agents)} agents")
        out = {}
        for team, idx in self.members.items():
            total = 0.0
            for i in idx:
                total += float(agent_returns[i])
            out[team] = total
        return out

    def annotate(self, ep: dict[str, Any]) -> Optional[dict[str, Any]]:
        """An episode row with per-agent returns (``AGENT_RETURNS``): with several teams its ``return``
        becomes the report team's and it gains the per-team columns; the returns.csv fields (``None``
        for a row without per-agent returns)."""
        agent_returns = ep.get(AGENT_RETURNS)
        if agent_returns is None:
            return None
        teams = self.team_returns(agent_returns)
        if not self.several and "return" in ep:  # the one team's return is the run's, to the last bit
            teams = {self.names[0]: float(ep["return"])}  # (the learner sums every step's rewards first)
        if self.several:
            ep["return"] = teams[self.report]
            ep.update({team_column(t): r for t, r in teams.items()})
        row = {f"team:{t}": r for t, r in teams.items()}
        row.update({f"agent:{a}": float(r) for a, r in zip(self.agents, agent_returns)})
        return row


def resolve_teams(spec: Any, agents: Sequence[str], report: Optional[str] = None) -> Teams:
    """``scenario.teams`` (None: the default above) over the env's ``agents``, and ``run.report_team``;
    a ConfigError naming what is wrong: an agent the env does not have, a prefix matching none, an
    agent in two teams or in none, a report team that is not one of the teams."""
    agents = [str(a) for a in agents]
    listing = ", ".join(agents)
    groups: dict[str, list[str]] = {}
    if spec is None:
        by_prefix = {p.rstrip("_"): [a for a in agents if a.startswith(p)] for p in MPE_PREFIXES}
        if all(any(a.startswith(p) for p in MPE_PREFIXES) for a in agents):
            groups = {name: found for name, found in by_prefix.items() if found}
        else:
            groups = {EVERYONE: list(agents)}
    else:
        if not isinstance(spec, dict) or not spec:
            raise ConfigError(f"scenario.teams: expected a mapping of team -> list of agents or agent-name prefix, "
                              f"got {spec!r}")
        for team, what in spec.items():
            key = f"scenario.teams.{team}"
            if isinstance(what, str):
                found = [a for a in agents if a.startswith(what)]
                if not found:
                    raise ConfigError(f"{key}: the prefix {what!r} matches no agent (the env's agents: {listing})")
            elif isinstance(what, (list, tuple)) and what and all(isinstance(a, str) for a in what):
                unknown = [a for a in what if a not in agents]
                if unknown:
                    raise ConfigError(f"{key}: unknown agent(s) {', '.join(unknown)} (the env's agents: {listing})")
                found = [a for a in agents if a in what]  # env order
            else:
                raise ConfigError(f"{key}: expected a list of agent names or an agent-name prefix, got {what!r}")
            groups[str(team)] = found
        seen: dict[str, str] = {}
        for team, found in groups.items():
            for a in found:
                if a in seen:
                    raise ConfigError(f"scenario.teams: agent {a} is in two teams, {seen[a]} and {team}")
                seen[a] = team
        left = [a for a in agents if a not in seen]
        if left:
            raise ConfigError(f"scenario.teams: leaves out agent(s) {', '.join(left)}; every agent must be in "
                              f"one team (the env's agents: {listing})")
    names = list(groups)
    if report is None:
        report = names[0]
    elif report not in groups:
        raise ConfigError(f"run.report_team: {report!r} names no team (the teams: {', '.join(names)})")
    index = {a: i for i, a in enumerate(agents)}
    return Teams(tuple(agents), {t: tuple(index[a] for a in found) for t, found in groups.items()}, report)


def teams_for(cfg: Any, agents: Sequence[str]) -> Teams:
    """The run's teams: ``scenario.teams`` where the scenario has that key, and ``run.report_team``."""
    return resolve_teams(getattr(cfg.scenario, "teams", None), agents, getattr(cfg.run, "report_team", None))


def with_team_fields(fields: list[str], teams: Optional[Teams]) -> list[str]:
    """An algorithm's metrics.csv columns with the per-team ones (``Teams.metric_fields``) after ``return``."""
    extra = teams.metric_fields() if teams is not None else []
    if not extra:
        return list(fields)
    at = fields.index("return") + 1 if "return" in fields else len(fields)
    return list(fields[:at]) + extra + list(fields[at:])


class ReturnsLog(FileLog):
    """returns.csv (see the module docstring), written through ``marl_q.rundir.MetricsWriter`` without a
    wall sidecar; ``resume``: the checkpoint's ``state()``; a checkpoint without one (taken before
    returns.csv existed) starts the file again."""

    def __init__(self, teams: Teams, out: Optional[Path], resume: Optional[dict[str, Any]] = None) -> None:
        from marl_q.rundir import MetricsWriter

        self.teams = teams
        position = (resume or {}).get("position")
        path = Path(out) / RETURNS_FILE if out is not None else None
        self.file = MetricsWriter(path, teams.returns_fields(), sidecar=False,
                                  resume_at=tuple(position) if position is not None else None)

    def write(self, base: dict[str, Any], ep: dict[str, Any]) -> None:
        """Annotate the episode row ``ep`` (``Teams.annotate``) and write its returns.csv row."""
        row = self.teams.annotate(ep)
        if row is not None:
            self.file.write(dict(base, **row))

    def summary(self, window: int) -> dict[str, Any]:
        """summary.json's part of a run with several teams: which team ``return`` is, and each team's
        final return (the mean of its last ``window`` episodes, as ``final_return``); {} with one team."""
        if not self.teams.several:
            return {}
        rows = self.file.rows
        final = {}
        for team in self.teams.names:
            values = [float(r[f"team:{team}"]) for r in rows if f"team:{team}" in r]
            values = [v for v in values if v == v][-window:]  # NaN: under way at a resume from before returns.csv
            final[team] = float(np.mean(values)) if values else None  # as final_return (marl_q.metrics)
        return {"report_team": self.teams.report, "final_team_return": final}

    def state(self) -> dict[str, Any]:
        return {"position": list(self.file.position())}
