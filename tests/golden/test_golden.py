"""Behaviour unchanged: every shipped scenario file, run briefly on sim, hashes as recorded.

The table was recorded before the "one place for each idea" refactor and is the
contract of every later refactor: a change that cannot keep the last bits (for example a reordered
float sum) regenerates its entry with ``python -m tests.golden.goldens NAME`` in the same commit and
adds a comment beside it saying why. A new scenario file gets its entry the same way.
"""
from __future__ import annotations

from pathlib import Path

import pytest

import importlib.util

from tests.golden.goldens import NEEDS, golden_hashes, scenario_files

GOLDEN = {
    "cartpole_a2c_sync.yaml": ("8634ea698991e53e64a12452731b6d70e1c61000ee345034d683bb274f2fd77a",
        "ea446dcdc70f3e706fc7f9104279292192fcfc2042c50a66cd224a7a24789547"),
    "cartpole_a3c.yaml": ("a43efddd3a221ec9ac48fa99e992207e8e5aea0c445eb8d504d70a629ec3cda4",
        "04479348f2353606237fc4889d515f4d9dec44b7f03fdac47461df4b589e2575"),
    "cartpole_diffqas_a3c.yaml": ("a44ad10e2965e1ab969795480f28b4a279c1061c25310d7d6c1cae0379746482",
        "a5576771cbd3889d5477f7cbff25ab36b9165daadbe4d536fa68fe0251304f88"),
    "cartpole_qa2c.yaml": ("7b3c735ecb2082d9bec3adffe80c459378ce826ec6c68ba51544790468ece288",
        "3367a9157bbf5c6042ba3cdec92eea2c6c2c0239297c50fc0f239f550e8d65c7"),
    "cartpole_qa2c_quantum_actor.yaml": ("37f97f20306f74527bab1d0e9cff6808e3a6fb81a97623d69f9aa32ebe187b67",
        "2e3ef99e53bb9f0ea81aad086d4f928eb234c19f1df28c775e8f89c72339a713"),
    "cartpole_qa2c_quantum_both.yaml": ("699b832173caa2eb20b04312b2964fbfa41439e4547f15d7c9e8ae8ccefc6c7f",
        "431b8622de8639a4b86982f3fbf8b67b9458bf2563a028a4e43f23a631c258bf"),
    "cartpole_qa2c_quantum_critic.yaml": ("04a339a44fe65d1dfaca6d50e06ea3a1a416c68e40dc477ba4127504654378cb",
        "c55b3ed34f71be86b9422aaa001e2038b9d479f04fae5524ab41126229bcb8d1"),
    # new with the scenario file (pure VQC actor and critic with trainable input and output scaling)
    "cartpole_skolik.yaml": ("800c0ac55ec8530b402764b87d99d8331f8bf358df537bd96d13619e066ac627",
        "458d25d2a8db7171f5538b30c94f349acd711a62c282f7537f4f4c66b78560e5"),
    "linear_mdp_regret.yaml": ("aacfbbc65b2a1383cd382ee083555bd8d3e29f2b51075db5c973a789fab55c47",
        "6c950713419836aea6c66dab046ae2e847e4040283eadf7e8584602b4294ae58"),
    "penalty_cue_coma.yaml": ("526ed16ae28cec9e6c7070eda745cab3fd2b56c998e38d9db62f91c465a66c41",
        "2b38ee48f39cb264fc11bca77e36de8af267e00067d234bf44e99e6b612d9d23"),
    "routing_amarl.yaml": ("259325c3935fcff0670c2c445ebe5051d3a058e3ba047638a97fc767de68281c",
        "42543ffe3622ad1e8145c67947774eed600fc903d395a26e5be5ab99e6e8c3b6"),
    "routing_single_ppo.yaml": ("7733ad687c0018c0b7a1ab8e4d0baa8ca9e0d479269653f794b28e94d1bdd319",
        "27deb2a0308e6ff27b5574e42db442eb597fc2610ecfca86662e83f6db9ab30f"),
    "speaker_listener_coma.yaml": ("8bd4c3cefc17c1cc510983554739690d12ac1db300979e17e890b62731ab6a04",
        "d75c37c82f6e6c20ebcb91cbb03b1a7f9417132967ff5f09aac461d79a918240"),
    "reference_mappo.yaml": ("e14538badd37fc8dbdba20a3b2beba19ebe2d247b932e8682d8efd64bdbfc88b",
        "5efe11e020dee047343d0516462515cdae6d53426ef7a7663d2449c9f9fa8d2e"),
    "pursuit_ippo.yaml": ("86091272479b6e6bd333db652ab09712504ee90dba23d68c54f06b5a3a9245a7",
        "1fc1d230a9ba04b935215ee589228a4670bfa307a8eac955810c84da6e7a2ec1"),
    "multiwalker_mappo.yaml": ("841189539e2341664e449e8a6a9dab10a2d63df9c0ab62af107668a2da3f9111",
        "3f3f443242be052845316484d220237ab9031e09ad001839851c7dc045d35407"),
    "pendulum_ppo.yaml": ("5f1f87202f262b7e6576d96f00653ffbd326179ad4f70fca43ed914ceed2d283",
        "3ee303b67b6b8d689d7fccf6332be84442917cb3ebc1f8e62776ddb7f570851a"),
    "spread_mappo.yaml": ("3ba1dedfb5925200740ba375972d82912b8dfc814654a339bc0ad2e457f16d80",
        "593e7c4ce99388a0076cd2b51638239fab6bc93f70a398dcf57964206dbdc69a"),
    "spread_coma.yaml": ("45381faf29eac37ebf5bcf26c34644e257199807d7104b7669f7da6766a0b01f",
        "d63113d9ec60919943642b305ee0cfb94ebc4f106611deb98c0b8e41b99f462d"),
    "team_cue_coma.yaml": ("23208eb0691dd12e93ba0583f2c0ce0e5af350e366e6b419720049d276f35a72",
        "ab74b9ba914fcf811888226ed5c911bb16e87293234aa172449c709f5a541376"),
    "vehicular_a3c.yaml": ("a443edb6f2ab708a20974da295ba7bdd389bc9395e70e94be9fa1f94647f8ba9",
        "a9c9618081cd0974a1679ac6eea9fa1fda50e19395af3121d900e659da2b8609"),
}


def test_every_scenario_file_has_a_golden():
    assert sorted(GOLDEN) == scenario_files()


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_short_sim_run_is_byte_identical_to_its_golden(name: str, tmp_path: Path):
    if name in NEEDS and importlib.util.find_spec(NEEDS[name]) is None:
        pytest.skip(f"{name} needs the SISL extra (pip install -e '.[sisl]'): {NEEDS[name]} is not installed")
    metrics, comm = GOLDEN[name]
    got = golden_hashes(name, tmp_path / "run")
    assert got["metrics.csv"] == metrics, f"{name}: metrics.csv changed"
    assert got["comm.csv"] == comm, f"{name}: comm.csv changed"
