"""marl_q.seeding: the historical streams keep their numbers; derive() is stable and separates streams."""
import numpy as np
import pytest

from marl_q import seeding


def test_historical_streams_keep_their_numbers():
    # the values recorded runs (golden hashes, summary.json evaluations, published figures) were made with
    assert seeding.worker_seed(3, 2) == 3002
    assert seeding.lsvi_worker_entropy(3, 2) == [3, 2]
    assert seeding.routing_demand_entropy(3002) == [3002, 1]
    assert seeding.vehicular_episode_seed(3002, 4) == 3002 + 4 * 7919
    assert seeding.coma_bootstrap_seed(5) == 7924
    assert seeding.timing_seed(3) == 7922
    assert seeding.duplicate_seed(3) == 104732
    assert seeding.coma_eval_seed(3) == 100_006 and seeding.coma_eval_seed(3, 7) == 100_013
    assert seeding.routing_eval_seed(3) == 10_003
    assert seeding.vehicular_eval_seed(3) == 100_300
    assert seeding.vehicular_eval_episode_seed(100_300, 2) == 102_300
    assert seeding.vehicular_traffic_seed(2) == 100_002
    assert seeding.coma_critic_probe_seed(3) == 7_780 and seeding.coma_critic_probe_seed(3, 1) == 7_781
    assert seeding.SCRIPTED_SPREAD_FIRST_SEED == 100_000 and seeding.scripted_episode_seed(100_000, 4) == 100_004


def test_entropy_lists_seed_generators_as_before():
    a = np.random.default_rng(seeding.lsvi_worker_entropy(3, 2)).random(3)
    assert np.array_equal(a, np.random.default_rng([3, 2]).random(3))


def test_derive_is_deterministic_and_separates_streams_and_paths():
    assert seeding.derive(0, "worker", 1) == seeding.derive(0, "worker", 1)
    assert seeding.derive(0, "env_copy", 1, 2) == 3923302646  # mappo's environment copies were seeded so
    seeds = {seeding.derive(0, s, i) for s in seeding.STREAMS for i in range(4)}
    assert len(seeds) == len(seeding.STREAMS) * 4
    with pytest.raises(ValueError, match="unknown seed stream"):
        seeding.derive(0, "nope")
