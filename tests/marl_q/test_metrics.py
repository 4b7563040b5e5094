"""Episode summaries against a hand-made sequence."""
from marl_q.metrics import episode_summary


def test_steps_and_time_to_solve_use_the_first_full_window():
    returns = [10, 20, 30, 40, 50]
    rows = [{"return": r, "env_steps": 100 * (i + 1), "t": 0.5 * (i + 1)} for i, r in enumerate(returns)]
    s = episode_summary(rows, solve_return=35, window=2)
    # window means: 15, 25, 35, 45 -> first >= 35 ends at episode 4
    assert s["steps_to_solve"] == 400 and s["time_to_solve"] == 2.0
    assert s["final_return"] == 45 and s["best_mean_return"] == 45
    assert episode_summary(rows, solve_return=100, window=2)["steps_to_solve"] is None
    assert episode_summary(rows[:1], solve_return=1, window=2)["steps_to_solve"] is None  # window not full
