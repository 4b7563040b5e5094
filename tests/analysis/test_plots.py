"""The standard plots (analysis.plots) do not mislead: bands per x and only from two seeds, one smoothing
window stated on the axis, titles from what was run, short legends, traffic as rates up and down on
their own axes, integer staleness ticks, --label/--title. Run directories are written by hand (no training)."""
from __future__ import annotations

import csv
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml

from analysis import plots
from marl_q.cli import main


def config(algorithm: str = "a3c", seed: int = 0, actor: str = "mlp", window: int = 100, **extra) -> dict:
    cfg = {
        "run": {"seed": seed, "total_env_steps": 1000, "solve_return": None, "solve_window": window,
                "progress": False, "plots": False},
        "backend": {"name": "sim", "workers": 4,
                    "compute": {"step_s": 1e-4, "stragglers": [], "straggler_factor": 1.0}},
        "server": {"aggregation": "hogwild", "staleness": {"rule": "constant"}, "max_staleness": None},
        "scenario": {"name": "cartpole"},
        "algorithm": {"name": algorithm, "lr": 0.001},
        "actor": {"head": actor, "hidden": [64, 64]} if actor == "mlp" else {"head": actor, "n_qubits": 4},
        "critic": {"head": "mlp", "hidden": [64, 64]},
    }
    for dotted, value in extra.items():
        node = cfg
        *parents, last = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return cfg


def write_run(path: Path, cfg: dict, returns, steps=None, comm_rows=None) -> Path:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    returns = np.asarray(returns, dtype=float)
    steps = np.arange(1, len(returns) + 1) * 10 if steps is None else steps
    with open(path / "metrics.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["t", "worker", "env_steps", "episode", "return", "length", "version"])
        for i, (s, r) in enumerate(zip(steps, returns)):
            w.writerow([s / 1000, "w0", s, i + 1, r, 10, i])
    if comm_rows is not None:
        with open(path / "comm.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["id", "t", "src", "dst", "kind", "seq", "bytes", "base_version", "server_version",
                        "staleness", "accepted", "reason"])
            for i, (t, src, dst, nbytes, stale) in enumerate(comm_rows):
                w.writerow([i, t, src, dst, "grad" if dst == "server" else "params", i, nbytes, 0, 0,
                            "" if stale is None else stale, 1, ""])
    (path / "summary.json").write_text(json.dumps({"status": "completed"}))
    return path


def comm(workers: int, per_worker: list[int], stale: int = 0) -> list:
    rows = []
    for w in range(workers):
        for k in range(per_worker[w]):
            rows.append((0.01 * k + 0.001 * w, f"w{w}", "server", 1000, stale))
            rows.append((0.01 * k + 0.001 * w + 0.0005, "server", f"w{w}", 2000, None))
    return sorted(rows)


@pytest.fixture
def figures(monkeypatch):
    """The figures the plots draw, kept open (plt.close is a no-op) for inspection."""
    kept = []
    close = plots.plt.close
    monkeypatch.setattr(plots.plt, "close", lambda fig=None: kept.append(fig))
    yield kept
    for fig in list(kept):
        if fig is not None:
            close(fig)


def by_name(figs, name: str):
    """The figure saved as `name` (plot_paths draws in a fixed order)."""
    order = ["return_vs_steps.png", "return_vs_time.png", "traffic.png", "staleness.png"]
    return figs[order.index(name)]


# ----------------------------------------------------------------------------- bands
def test_band_is_clipped_per_x_not_to_the_range_over_all_x():
    a = np.array([0.0, 0.0, 100.0, 0.0])
    b = np.array([1.0, 1.0, -100.0, 1.0])
    mean, lo, hi = plots.mean_band([a, b])
    both = np.vstack([a, b])
    assert np.all(lo >= both.min(axis=0) - 1e-12) and np.all(hi <= both.max(axis=0) + 1e-12)
    width = hi - lo
    assert width[0] == pytest.approx(1.0)  # where the seeds are 1 apart, the band is 1 wide
    assert width[2] == pytest.approx(200.0)  # and only where they are 200 apart is it 200 wide


def test_no_band_from_one_seed_and_nan_where_only_one_seed_reaches():
    mean, lo, hi = plots.mean_band([np.array([1.0, 2.0, 3.0])])
    assert np.isnan(lo).all() and np.isnan(hi).all()
    mean, lo, hi = plots.mean_band([np.array([1.0, 2.0, 3.0]), np.array([2.0, 3.0, np.nan])])
    assert np.isfinite(lo[:2]).all() and np.isnan(lo[2]) and mean[2] == 3.0


def test_learning_plot_band_and_legend_say_what_the_band_is(tmp_path, figures):
    rng = np.random.default_rng(0)
    for s in range(3):
        write_run(tmp_path / "sw" / f"seed{s}", config(seed=s), rng.normal(size=300))
    plots.plot_paths([tmp_path / "sw"], tmp_path / "out")
    ax = by_name(figures, "return_vs_steps.png").axes[0]
    legend = ax.get_legend()
    assert "95% t-interval over 3 seeds" in legend.get_title().get_text()
    assert any("(3 seeds)" in t.get_text() for t in legend.get_texts())
    assert len(ax.collections) == 1  # one band
    # the band's vertices lie within what the seeds span overall (they may not fill the axes)
    verts = ax.collections[0].get_paths()[0].vertices
    curves = np.vstack([plots._curve(plots.load_run(tmp_path / "sw" / f"seed{s}"), "env_steps",
                                     np.linspace(0, 3000, plots.GRID_POINTS)) for s in range(3)])
    assert verts[:, 1].max() <= np.nanmax(curves) + 1e-9 and verts[:, 1].min() >= np.nanmin(curves) - 1e-9


def test_single_run_has_no_band_and_says_so(tmp_path, figures):
    write_run(tmp_path / "r", config(), np.arange(150.0))
    plots.plot_paths([tmp_path / "r"], tmp_path / "out")
    ax = by_name(figures, "return_vs_steps.png").axes[0]
    assert len(ax.collections) == 0
    title = ax.get_legend().get_title().get_text()
    assert "no band" in title and "95%" not in title and "95%" not in ax.get_ylabel()


def test_env_step_axes_read_250k_and_1m_and_time_axes_stay_seconds(tmp_path, figures):
    """The return-vs-steps figure ticks its env steps as 250k / 1M (no 1e6 in the corner); the
    return-vs-time figure keeps plain seconds."""
    write_run(tmp_path / "r", config(), np.arange(150.0))
    plots.plot_paths([tmp_path / "r"], tmp_path / "out")
    steps = by_name(figures, "return_vs_steps.png").axes[0]
    assert steps.get_xlabel() == plots.STEPS_LABEL
    fmt = steps.xaxis.get_major_formatter()
    assert [fmt(x, 0) for x in (250_000, 1_000_000, 1_500)] == ["250k", "1M", "1.5k"]
    time = by_name(figures, "return_vs_time.png").axes[0]
    assert time.xaxis.get_major_formatter()(250_000, 0) != "250k"


def test_marlq_coma_env_step_axis_reads_1m(tmp_path, monkeypatch):
    from analysis import coma

    grid = np.linspace(0, 2_000_000, 5)
    curve = coma.Curve(grid=grid, mean=np.zeros(5), ci=np.zeros(5), seeds=1, low=np.zeros(5), high=np.zeros(5))
    kept = []
    monkeypatch.setattr(plots.plt, "close", lambda fig=None: kept.append(fig))
    coma.plot_curves({"a": curve}, tmp_path / "c.png", "t", None, "y")
    ax = kept[0].axes[0]
    assert ax.get_xlabel() == plots.STEPS_LABEL and ax.xaxis.get_major_formatter()(1_000_000, 0) == "1M"
    plots.plt.close(kept[0])


# ----------------------------------------------------------------------------- smoothing
def test_smoothing_window_is_the_runs_solve_window_and_stated_on_the_axis(tmp_path, figures):
    returns = np.r_[np.zeros(50), np.full(50, 10.0)]
    write_run(tmp_path / "r", config(window=7), returns)
    plots.plot_paths([tmp_path / "r"], tmp_path / "out")
    ax = by_name(figures, "return_vs_steps.png").axes[0]
    assert "last 7 episodes" in ax.get_ylabel() and "solve_window" in ax.get_ylabel()
    x, y = ax.lines[0].get_data()
    expect = np.interp(x, np.arange(1, 101) * 10, plots.smoothed(returns, 7))
    ok = np.isfinite(y)
    assert np.allclose(y[ok], expect[ok])
    assert plots.SMOOTH_EPISODES == 100  # the default run.solve_window: marlq plot and marlq coma agree


def test_marlq_coma_smooths_over_the_same_window_as_marlq_plot(tmp_path, monkeypatch):
    from analysis import coma

    write_run(tmp_path / "r", config(window=7), np.arange(40.0))
    seen = {}
    real = coma.group_curves
    monkeypatch.setattr(coma, "group_curves", lambda runs, window, **kw: seen.setdefault("w", window) and real(runs, window))
    assert main(["coma", str(tmp_path / "r"), "--out", str(tmp_path / "c.png")]) == 0
    assert seen["w"] == 7


# ----------------------------------------------------------------------------- titles and legends
def test_title_names_every_algorithm_not_the_first(tmp_path):
    for algo in ("coma", "iac", "central_v"):
        for s in range(2):
            write_run(tmp_path / algo / f"seed{s}", config(algorithm=algo, seed=s), np.zeros(20))
    runs = [plots.load_run(p) for p in plots.find_runs([tmp_path])]
    title = plots.describe(runs)
    assert title.startswith("central_v vs coma vs iac on cartpole")
    assert "2 seeds each" in title


def test_title_says_heads_staleness_rule_and_stragglers(tmp_path):
    cfg = config(actor="vqc", server__staleness={"rule": "poly", "a": 0.5},
                 backend__compute={"stragglers": [0], "straggler_factor": 10.0})
    write_run(tmp_path / "q", cfg, np.zeros(10))
    title = plots.describe([plots.load_run(tmp_path / "q")])
    assert "quantum actor (vqc)" in title and "classical critic" in title
    assert "staleness poly" in title and "stragglers [0] x10" in title and "hogwild" in title
    write_run(tmp_path / "c", config(), np.zeros(10))
    title = plots.describe([plots.load_run(tmp_path / "c")])
    assert "classical heads" in title and "no stragglers" in title


def test_title_and_label_name_the_env_of_a_generic_scenario(tmp_path):
    write_run(tmp_path / "g", config(algorithm="ppo", scenario={"name": "gymnasium", "env": "Pendulum-v1"}),
              np.zeros(10))
    run = plots.load_run(tmp_path / "g")
    assert plots.describe([run]).startswith("ppo on gymnasium Pendulum-v1, ")
    assert list(plots.group_runs([run])) == ["ppo on gymnasium Pendulum-v1"]
    cfg = config(algorithm="ippo", scenario={"name": "pettingzoo", "env": "mpe2.simple_reference_v3:parallel_env"})
    write_run(tmp_path / "p", cfg, np.zeros(10))
    assert plots.describe([plots.load_run(tmp_path / "p")]).startswith("ippo on pettingzoo mpe2.simple_reference_v3, ")
    write_run(tmp_path / "f", config(scenario={"name": "gymnasium", "env": "mypkg.envs:make_env"}), np.zeros(10))
    assert "on gymnasium mypkg.envs:make_env, " in plots.describe([plots.load_run(tmp_path / "f")])


@pytest.mark.parametrize("extra, said, unsaid", [
    ({"backend__workers": 1}, ["sim x1 worker, 1 seed"], ["aggregation", "staleness", "stragglers"]),
    ({"backend__workers": 1, "server__aggregation": "buffered", "server__buffer_k": 4},
     ["buffered (K=4) aggregation, sim x1 worker"], ["staleness", "stragglers"]),
    ({"server__aggregation": "sync", "server__staleness": {"rule": "poly"}},
     ["sync aggregation, no stragglers, sim x4 workers"], ["staleness"]),
    ({"backend__name": "local", "backend__compute": {"stragglers": [0], "straggler_factor": 10.0}},
     ["hogwild aggregation, staleness constant, local x4 workers"], ["stragglers"]),
])
def test_title_leaves_out_settings_that_have_no_effect(tmp_path, extra, said, unsaid):
    write_run(tmp_path / "r", config(**extra), np.zeros(10))
    second = plots.describe([plots.load_run(tmp_path / "r")]).splitlines()[1]
    assert all(text in second for text in said), second
    assert not any(text in second for text in unsaid), second


def test_legend_labels_are_short_and_name_only_differing_keys(tmp_path, figures):
    write_run(tmp_path / "quickstart", config(), np.zeros(30))
    write_run(tmp_path / "vqc", config(actor="vqc", algorithm__lr=0.01, algorithm__gamma=0.9,
                                       algorithm__entropy=0.1, server__aggregation="sync"), np.zeros(30))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "Tight layout not applied", no other warning
        plots.plot_paths([tmp_path / "quickstart", tmp_path / "vqc"], tmp_path / "out")
    ax = by_name(figures, "return_vs_steps.png").axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(labels) == 2
    for text in labels:
        assert len(text) <= plots.LABEL_CHARS_MAX + len(" (1 seed)")
        assert "hidden" not in text and "n_qubits" not in text  # implied by the differing head
        assert "seed=" not in text
    assert any(text.startswith("actor=vqc") for text in labels) and any("more" in text for text in labels)
    # the legend and the titles sit inside the figure
    fig = by_name(figures, "return_vs_steps.png")
    fig.canvas.draw()
    box = ax.get_legend().get_window_extent()
    fbox = fig.bbox
    assert box.x0 >= fbox.x0 and box.x1 <= fbox.x1 and box.y0 >= fbox.y0 and box.y1 <= fbox.y1


def test_traffic_subplot_titles_do_not_overlap(tmp_path, figures):
    for name, agg in (("a", "hogwild"), ("b", "sync")):
        write_run(tmp_path / name, config(server__aggregation=agg, algorithm__lr=0.5 if name == "b" else 0.1),
                  np.zeros(10), comm_rows=comm(2, [5, 5]))
    plots.plot_paths([tmp_path], tmp_path / "out")
    fig = by_name(figures, "traffic.png")
    fig.canvas.draw()
    boxes = [ax.title.get_window_extent() for ax in fig.axes]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b)


# ----------------------------------------------------------------------------- traffic, staleness
def steady(workers: int = 1, uploads: int = 100, every: float = 0.01, up: int = 1000, down: int = 2000) -> list:
    """Each worker uploads `up` bytes every `every` s and hears back `down` bytes 0.5 ms later."""
    rows = []
    for w in range(workers):
        for k in range(uploads):
            rows.append((every * k + 0.001 * w, f"w{w}", "server", up, 0))
            rows.append((every * k + 0.001 * w + 0.0005, "server", f"w{w}", down, None))
    return sorted(rows)


def middle(line) -> float:
    """The median of a drawn line over the middle half of its x range (away from the run's ends)."""
    x, y = (np.asarray(v, dtype=float) for v in line.get_data())
    keep = (x > 0.25 * x.max()) & (x < 0.75 * x.max())
    return float(np.median(y[keep]))


def test_traffic_is_rates_with_up_and_down_on_their_own_axes_in_stated_units(tmp_path, figures):
    write_run(tmp_path / "r", config(), np.zeros(10), comm_rows=steady(workers=2))
    plots.plot_paths([tmp_path / "r"], tmp_path / "o")
    fig = by_name(figures, "traffic.png")
    (bytes_up, bytes_down), (msgs_up, msgs_down) = np.array(fig.axes).reshape(2, 2)
    assert bytes_up.get_title().startswith("up") and bytes_down.get_title().startswith("down")
    assert bytes_up.get_ylabel() == "payload per worker (kB/s)"
    assert msgs_up.get_ylabel() == "messages per worker per s" and msgs_up.get_xlabel() == "virtual time (s)"
    # 1000 B up and 2000 B down every 10 ms: 100 kB/s up, 200 kB/s down, 100 messages/s each way
    assert middle(bytes_up.lines[0]) == pytest.approx(100, rel=0.05)
    assert middle(bytes_down.lines[0]) == pytest.approx(200, rel=0.05)
    assert middle(msgs_up.lines[0]) == pytest.approx(100, rel=0.05)
    assert middle(msgs_down.lines[0]) == pytest.approx(100, rel=0.05)
    assert all(len(ax.lines) == 1 and not ax.collections for ax in fig.axes)  # one seed: no band
    legend = fig.legends[0]
    assert "1 seed per line: no band" in legend.get_title().get_text()
    assert "mean worker" in legend.get_title().get_text() and "window" in legend.get_title().get_text()
    fig.canvas.draw()
    box, fbox = legend.get_window_extent(), fig.bbox
    assert box.x0 >= fbox.x0 and box.x1 <= fbox.x1 and box.y0 >= fbox.y0 and box.y1 <= fbox.y1


def test_traffic_bands_are_over_seeds_and_say_so(tmp_path, figures):
    for seed, nbytes in ((0, 1000), (1, 1200)):
        write_run(tmp_path / "sw" / f"seed{seed}", config(seed=seed), np.zeros(10), comm_rows=steady(2, up=nbytes))
    plots.plot_paths([tmp_path / "sw"], tmp_path / "o")
    fig = by_name(figures, "traffic.png")
    assert all(len(ax.collections) == 1 for ax in fig.axes)  # the band over the 2 seeds, on every panel
    assert middle(fig.axes[0].lines[0]) == pytest.approx(110, rel=0.05)  # the mean of 100 and 120 kB/s
    assert "95% t-interval over 2 seeds" in fig.legends[0].get_title().get_text()
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["a3c on cartpole (2 seeds)"]


def test_traffic_one_line_per_group_or_per_worker_when_one_groups_workers_differ(tmp_path, figures):
    write_run(tmp_path / "alike", config(), np.zeros(10), comm_rows=comm(8, [5] * 8))
    plots.plot_paths([tmp_path / "alike"], tmp_path / "o1")
    fig = by_name(figures, "traffic.png")
    assert all(len(ax.lines) == 1 for ax in fig.axes)  # the mean worker
    figures.clear()
    write_run(tmp_path / "differ", config(), np.zeros(10), comm_rows=comm(3, [2, 5, 9]))
    plots.plot_paths([tmp_path / "differ"], tmp_path / "o2")
    fig = by_name(figures, "traffic.png")
    assert all(len(ax.lines) == 3 for ax in fig.axes)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["w0 (1 seed)", "w1 (1 seed)", "w2 (1 seed)"]
    assert "each worker" in fig.legends[0].get_title().get_text()
    figures.clear()
    for name, agg in (("a", "hogwild"), ("b", "sync")):  # two groups: a line each, named by the legend key
        write_run(tmp_path / "two" / name, config(server__aggregation=agg), np.zeros(10), comm_rows=comm(3, [2, 5, 9]))
    plots.plot_paths([tmp_path / "two"], tmp_path / "o3")
    fig = by_name(figures, "traffic.png")
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["hogwild (1 seed)", "sync (1 seed)"]
    assert fig.legends[0].get_title().get_text().startswith("server.aggregation\n")


@pytest.mark.parametrize("stale", [0, 3])
def test_staleness_ticks_are_integers(tmp_path, figures, stale):
    write_run(tmp_path / "r", config(), np.zeros(10), comm_rows=comm(2, [5, 5], stale=stale))
    plots.plot_paths([tmp_path / "r"], tmp_path / "out")
    ax = by_name(figures, "staleness.png").axes[0]
    lo, hi = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
    assert ticks and all(float(t).is_integer() for t in ticks)


def test_staleness_histograms_alike_are_one_line_naming_every_group(tmp_path, figures):
    for algo in ("coma", "iac"):
        write_run(tmp_path / "sw" / algo / "seed0", config(algorithm=algo), np.zeros(10), comm_rows=comm(2, [5, 5], stale=1))
    write_run(tmp_path / "sw" / "central_v" / "seed0", config(algorithm="central_v"), np.zeros(10),
              comm_rows=comm(2, [5, 5], stale=2))
    plots.plot_paths([tmp_path / "sw"], tmp_path / "out")
    ax = by_name(figures, "staleness.png").axes[0]
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(texts) == 2 and len(ax.patches) == 2
    assert any(t.startswith("2 groups alike: ") and "coma" in t and "iac" in t for t in texts)
    assert any(t.startswith("central_v (mean 2.00") for t in texts)


# ----------------------------------------------------------------------------- --label, --title
def test_label_and_title_on_marlq_plot(tmp_path, figures, capsys):
    for algo in ("coma", "iac"):
        write_run(tmp_path / "sw" / algo / "seed0", config(algorithm=algo), np.zeros(10))
    rc = main(["plot", str(tmp_path / "sw"), "--out", str(tmp_path / "out"), "--label", "coma=COMA (ours)",
               "--label", f"{tmp_path / 'sw' / 'iac'}=independent", "--title", "My title"])
    assert rc == 0
    ax = figures[0].axes[0]
    assert ax.get_title() == "My title"
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert texts == ["COMA (ours) (1 seed)", "independent (1 seed)"]


@pytest.mark.parametrize("label", ["nothing=x", "=x", "novalue"])
def test_bad_label_exits_2_with_one_line(tmp_path, capsys, label):
    write_run(tmp_path / "r", config(), np.zeros(10))
    assert main(["plot", str(tmp_path / "r"), "--out", str(tmp_path / "out"), "--label", label]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("marlq: error: --label:")


def test_group_labels_leave_out_zero_keys_of_a_section_set_in_some_groups(tmp_path):
    """critic.noise set in two groups (its other channels 0.0) and null in the third: the labels name
    shots and depolarizing, not the channels at 0 that only tell 'set' from 'unset'."""
    noise = {"depolarizing": 0.01, "amplitude_damping": 0.0, "phase_damping": 0.0, "readout": 0.0}
    write_run(tmp_path / "exact", config(critic__noise=None, critic__shots=None), np.zeros(5))
    write_run(tmp_path / "shots", config(critic__noise=None, critic__shots=128), np.zeros(5))
    write_run(tmp_path / "noisy", config(critic__noise=noise, critic__shots=None), np.zeros(5))
    runs = [plots.load_run(tmp_path / name) for name in ("exact", "shots", "noisy")]
    labels = sorted(plots.group_runs(runs))
    assert labels == ["depolarizing=0.01, shots=None", "depolarizing=None, shots=128", "depolarizing=None, shots=None"]


def test_a_groups_mean_stops_where_its_shortest_seed_ends(tmp_path, figures):
    """Two seeds of one group, one 10 episodes shorter: the mean line (and band) is drawn only where
    both have data, not as the longer seed alone after the shorter one ends."""
    write_run(tmp_path / "s0", config(seed=0), np.full(40, 10.0))
    write_run(tmp_path / "s1", config(seed=1), np.full(30, 30.0))
    plots.plot_paths([tmp_path], tmp_path / "out")
    line = by_name(figures, "return_vs_steps.png").axes[0].get_lines()[0]
    x, y = line.get_xdata(), line.get_ydata()
    assert np.all(np.isnan(y[x > 300])) and np.allclose(y[(x >= 10) & (x <= 300)], 20.0)
