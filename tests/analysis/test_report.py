"""`marlq report`: one self-contained HTML page with every figure (PNG data: URIs) and table; its IQM and
probability of improvement equal hand and brute-force computations; the aggregate statistics of
analysis.stats against independent references; bad inputs exit 2 with one line. Run directories are
written by hand (no training)."""
from __future__ import annotations

import base64
import json
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from analysis.stats import iqm, probability_of_improvement, stratified_bootstrap_ci
from marl_q.cli import main
from tests.analysis.test_plots import comm, config, write_run

FINALS = {"coma": [1.0, 2.0, 3.0, 4.0, 100.0], "iac": [2.0, 2.0, 5.0, 6.0, -50.0], "central_v": [0.0, 3.0, 3.0, 7.0, 8.0]}


class Page(HTMLParser):
    """The figures (img src), tables (rows of cell texts) and h2 headings of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[dict[str, str]] = []
        self.tables: list[list[list[str]]] = []
        self.h2: list[str] = []
        self.links: list[str] = []
        self._cell: list[str] | None = None
        self._in_h2 = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs)
        elif tag in ("link", "script") or (tag == "a" and attrs.get("href")):
            self.links.append(tag)
        elif tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "h2":
            self._in_h2 = True
            self.h2.append("")

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell))
            self._cell = None
        elif tag == "h2":
            self._in_h2 = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._in_h2:
            self.h2[-1] += data


def parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def make_sweep(root: Path) -> Path:
    """3 algorithms x 5 seeds, final returns FINALS, 4 workers with traffic and staleness each."""
    for algo, finals in FINALS.items():
        for seed, final in enumerate(finals):
            run = write_run(root / f"algorithm.name={algo}" / f"seed{seed}", config(algo, seed),
                            np.linspace(0, final, 150), comm_rows=comm(4, [5, 5, 6, 5], stale=seed % 2))
            (run / "summary.json").write_text(json.dumps({
                "status": "completed", "final_return": final, "steps_to_solve": None, "wall_s": 10.0 + seed,
                "virtual_s": 1.5, "messages": 42, "bytes_up": 21000, "bytes_down": 42000, "rejected": 0,
                "dropped_stale": seed}))
    return root


def find_table(page: Page, *header: str) -> list[list[str]]:
    """The one table whose header row starts with ``header``."""
    hits = [t for t in page.tables if t and t[0][:len(header)] == list(header)]
    assert len(hits) == 1, [t[0] for t in page.tables]
    return hits[0]


def first_number(cell: str) -> float:
    return float(cell.split()[0].replace(",", ""))


@pytest.fixture(scope="module")
def sweep_page(tmp_path_factory):
    root = make_sweep(tmp_path_factory.mktemp("report") / "sweep")
    out = root.parent / "page.html"
    assert main(["report", str(root), "--out", str(out), "--reps", "300"]) == 0
    return out


def test_the_page_holds_every_figure_as_an_embedded_png_and_every_table(sweep_page):
    page = parse(sweep_page)
    alts = sorted(img["alt"] for img in page.images)
    assert alts == sorted(["return vs environment steps", "return vs virtual time (s)", "traffic per worker",
                           "staleness of accepted updates"])
    for img in page.images:
        assert img["src"].startswith("data:image/png;base64,")
        png = base64.b64decode(img["src"].split(",", 1)[1], validate=True)
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert not page.links  # no external stylesheet, script or link: the file stands alone
    assert page.h2 == ["Learning curves", "Results per group", "Aggregate metrics (final return)",
                       "Config differences between groups", "Ledger per worker", "Traffic", "Staleness", "Runs"]
    results = find_table(page, "group", "n", "final return (last solve_window episodes)")
    assert sorted(r[0] for r in results[1:]) == sorted(FINALS)
    for row in results[1:]:  # mean [95% t-interval clipped to the seeds' range], by hand
        finals = FINALS[row[0]]
        half = sps.t.ppf(0.975, 4) * np.std(finals, ddof=1) / np.sqrt(5)
        lo, hi = max(np.mean(finals) - half, min(finals)), min(np.mean(finals) + half, max(finals))
        assert row[2] == f"{np.mean(finals):,.2f} [{lo:,.2f}, {hi:,.2f}]"
    assert results[0][results[0].index("wall time (s)") + 1] == "runs at once (sweep --jobs)"
    assert {r[results[0].index("runs at once (sweep --jobs)")] for r in results[1:]} == {"—"}  # written by hand
    diff = find_table(page, "config key")
    assert diff[0] == ["config key", *diff[1][1:]] and sorted(diff[1][1:]) == sorted(FINALS)
    ledgers = [t for t in page.tables if t[0][0] == "worker"]
    assert len(ledgers) == 3
    for t in ledgers:  # per worker: pushes that arrived (seq 1..n), messages each way, MB each way
        assert [r[0] for r in t[1:]] == ["w0", "w1", "w2", "w3"]
        assert [r[6] for r in t[1:]] == ["5.0", "5.0", "6.0", "5.0"]  # messages up
        assert [r[8] for r in t[1:]] == ["0.01", "0.01", "0.01", "0.01"]  # MB up (5-6 x 1000 bytes)
    runs = find_table(page, "run directory")
    assert len(runs) == 1 + 15


def test_iqm_table_equals_the_hand_computation(sweep_page):
    agg = find_table(parse(sweep_page), "group", "n", "IQM [95% CI]", "mean [95% CI]")
    assert sorted(r[0] for r in agg[1:]) == sorted(FINALS)
    for row in agg[1:]:
        finals = sorted(FINALS[row[0]])
        drop = len(finals) // 4  # 25% of 5 runs, rounded down: one at each end
        assert first_number(row[2]) == pytest.approx(round(np.mean(finals[drop:len(finals) - drop]), 2))
        assert first_number(row[3]) == pytest.approx(round(np.mean(finals), 2))
        lo, hi = (float(x) for x in row[2].split("[")[1].rstrip("]").split(","))
        assert min(finals) <= lo <= first_number(row[2]) <= hi <= max(finals)


def test_probability_of_improvement_table_equals_a_brute_force_count(sweep_page):
    page = parse(sweep_page)
    poi = find_table(page, "P(row > column)")
    labels = poi[0][1:]
    for row in poi[1:]:
        for col, cell in zip(labels, row[1:]):
            if col == row[0]:
                assert cell == "—"
                continue
            wins = 0.0
            for x in FINALS[row[0]]:
                for y in FINALS[col]:
                    wins += 1.0 if x > y else 0.5 if x == y else 0.0
            assert first_number(cell) == pytest.approx(round(wins / 25, 2))


# ----------------------------------------------------------------------------- analysis.stats
def test_iqm_drops_a_quarter_at_each_end_by_hand():
    rng = np.random.default_rng(1)
    for n in range(4, 14):
        x = rng.normal(size=n)
        k = n // 4
        assert iqm(x) == pytest.approx(np.sort(x)[k:n - k].mean())
    assert iqm([1, 2, 3, 4, 100]) == 3.0


def test_probability_of_improvement_equals_pairwise_count_with_ties_and_tasks():
    rng = np.random.default_rng(2)
    x, y = rng.integers(0, 4, size=(7, 3)).astype(float), rng.integers(0, 4, size=(5, 3)).astype(float)
    per_task = []
    for j in range(3):
        count = sum((a > b) + 0.5 * (a == b) for a in x[:, j] for b in y[:, j])
        per_task.append(count / (7 * 5))
    assert probability_of_improvement(x, y) == pytest.approx(np.mean(per_task))
    assert probability_of_improvement(x, y) + probability_of_improvement(y, x) == pytest.approx(1.0)
    # and the Mann-Whitney U statistic over n*m, task by task (scipy, an independent implementation)
    u = [sps.mannwhitneyu(x[:, j], y[:, j]).statistic / 35 for j in range(3)]
    assert probability_of_improvement(x, y) == pytest.approx(np.mean(u))


def test_stratified_bootstrap_resamples_runs_within_each_task():
    x = np.array([[0.0, 10.0], [1.0, 11.0], [2.0, 12.0]])  # task 0 in {0,1,2}, task 1 in {10,11,12}
    seen = []

    def record(m):
        seen.append(m.copy())
        return float(m.mean())
    stratified_bootstrap_ci(record, x, reps=200)
    draws = np.array(seen[:-1])  # the last call is the statistic on the data itself
    assert np.isin(draws[:, :, 0], x[:, 0]).all() and np.isin(draws[:, :, 1], x[:, 1]).all()
    assert len({d.tobytes() for d in draws}) > 50  # runs are drawn, with replacement


def test_bootstrap_interval_of_a_mean_covers_like_the_t_interval():
    """Sampled: for 60 normal draws the 95% percentile bootstrap interval of the mean is within 10% of
    the t-interval's width (the two agree to O(1/n) for a normal sample; seed fixed)."""
    x = np.random.default_rng(3).normal(5.0, 2.0, size=60)
    est, lo, hi = stratified_bootstrap_ci(lambda a: float(np.mean(a)), x, reps=4000, seed=4)
    half = sps.t.ppf(0.975, 59) * x.std(ddof=1) / np.sqrt(60)
    assert est == pytest.approx(x.mean())
    assert (hi - lo) == pytest.approx(2 * half, rel=0.1)
    assert lo < x.mean() < hi


# ----------------------------------------------------------------------------- bad input
def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("marlq report: error: ")
    return err[0]


def test_not_a_run_directory_is_one_line_exit_2(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    assert "nowhere: no such file or directory" in one_line(capsys)
    (tmp_path / "f.txt").write_text("x")
    assert main(["report", str(tmp_path / "f.txt")]) == 2
    assert "f.txt: not a directory" in one_line(capsys)


def test_an_empty_sweep_is_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "empty" / "algorithm.name=coma").mkdir(parents=True)
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "no run directories under" in one_line(capsys)
    assert not (tmp_path / "empty" / "report.html").exists()


def test_an_unwritable_out_is_one_line_exit_2(tmp_path, capsys):
    root = make_sweep(tmp_path / "s")
    assert main(["report", str(root), "--out", str(tmp_path)]) == 2
    assert "is a directory" in one_line(capsys)
    (tmp_path / "file").write_text("x")
    assert main(["report", str(root), "--out", str(tmp_path / "file" / "r.html")]) == 2
    assert "--out: cannot write" in one_line(capsys)
    assert main(["report", str(root), "--reps", "5"]) == 2
    assert "--reps: must be at least 100" in one_line(capsys)


def test_a_single_run_page_has_no_aggregates_and_says_alike_workers_once(tmp_path):
    run = write_run(tmp_path / "run", config("coma"), np.linspace(-5, 5, 150), comm_rows=comm(4, [5, 5, 5, 5]))
    lines = (run / "comm.csv").read_text().splitlines()
    pushed: dict[str, int] = {}
    for i, line in enumerate(lines[1:], 1):  # each worker numbers its own pushes 1, 2, ... (as a worker does)
        cells = line.split(",")
        if cells[3] == "server":
            pushed[cells[2]] = pushed.get(cells[2], 0) + 1
            cells[5] = str(pushed[cells[2]])
        lines[i] = ",".join(cells)
    (run / "comm.csv").write_text("\n".join(lines) + "\n")
    (run / "summary.json").write_text(json.dumps({"status": "completed", "final_return": 4.0, "messages": 40}))
    assert main(["report", str(run)]) == 0
    page = parse(run / "report.html")
    assert page.h2 == ["Learning curves", "Results per group", "Ledger per worker", "Traffic", "Staleness", "Runs"]
    assert len(page.images) == 4
    results = find_table(page, "group", "n", "final return (last solve_window episodes)")
    assert results[1][:3] == ["coma on cartpole", "1", "4.00"]  # one seed: no interval
    ledger = find_table(page, "worker")
    assert len(ledger) == 2 and ledger[1][0] == "each of w0..w3 (4 alike workers)" and ledger[1][6] == "5.0"


def write_quantum(run: Path, steps: np.ndarray, circuits_per_step: float, shots: int | None, jobs_per_step: float) -> None:
    """A quantum.csv beside metrics.csv: the critic's cumulative counts at each row's env steps."""
    from marl_q.quantum import COLUMNS

    with open(run / "quantum.csv", "w") as fh:
        fh.write("t,worker,env_steps,episode," + ",".join(COLUMNS) + "\n")
        for i, s in enumerate(steps):
            values = dict.fromkeys(COLUMNS, 0)
            values["critic_act_circuits"] = circuits = int(circuits_per_step * s)
            values["critic_act_shots"] = circuits * (shots or 0)
            values["critic_act_jobs"] = int(jobs_per_step * s)
            values.update(circuits=circuits, shots=circuits * (shots or 0))
            row = [values[c] for c in COLUMNS[:-1]] + [""]  # no qpu: profile recorded
            fh.write(f"{s / 1000},w0,{s},{i + 1}," + ",".join(str(v) for v in row) + "\n")


def test_quantum_resources_to_a_target_equal_a_hand_computation(tmp_path):
    """--target R: env steps, circuits, shots and QPU hours up to the first episode whose trailing mean
    (run.solve_window) reached R; --qpu costs runs recorded without a profile (exact heads at the assumed
    1024 shots per circuit). Everything below is computed by hand from the written files."""
    from marl_q.quantum import QPU_PROFILES

    window = 4
    returns = [0, 0, 0, 0, 10, 10, 10, 10, 10, 10]  # trailing mean of 4 reaches 5 at index 5 (0+0+10+10)/4
    steps = np.arange(1, 11) * 100
    sampled = write_run(tmp_path / "g" / "shots", config(seed=0, window=window, critic__shots=128), returns, steps)
    exact = write_run(tmp_path / "g" / "exact", config(seed=0, window=window), returns[:5] + [0] * 5, steps)
    write_quantum(sampled, steps, circuits_per_step=3, shots=128, jobs_per_step=0.5)
    write_quantum(exact, steps, circuits_per_step=2, shots=None, jobs_per_step=1)
    assert main(["report", str(tmp_path / "g"), "--target", "5", "--qpu", "superconducting"]) == 0
    page = parse(tmp_path / "g" / "report.html")
    assert "Quantum resources" in page.h2
    tab = next(t for t in page.tables if t[0][:3] == ["group", "n", "reached"])
    rows = {r[0]: dict(zip(tab[0], r)) for r in tab[1:]}
    shots_row = next(v for k, v in rows.items() if "128" in k)
    exact_row = next(v for k, v in rows.items() if "128" not in k)
    prof = QPU_PROFILES["superconducting"]
    # the sampled run reaches 5 at its 6th episode: 600 env steps, 1800 circuits of 128 shots, 300 jobs
    assert shots_row["reached"] == "1 of 1" and shots_row["env steps to reach 5"] == "600"
    assert shots_row["circuits to reach 5"] == "1,800" and shots_row["shots to reach 5"] == f"{1800 * 128:,}"
    hours = (1800 * 128 * prof.shot_s + 1800 * prof.circuit_s + 300 * prof.job_s) / 3600
    assert shots_row["QPU hours to reach 5"] == f"{hours:,.1f}"
    assert shots_row["shots per env step"] == "384"
    # the exact run's trailing mean peaks at 2.5 < 5: not reached; its whole-run hours at 1024 assumed shots
    assert exact_row["reached"] == "0 of 1" and exact_row["env steps to reach 5"] == "—"
    assert exact_row["shots per env step"] == "—"
    whole = (2000 * 1024 * prof.shot_s + 2000 * prof.circuit_s + 1000 * prof.job_s) / 3600
    assert exact_row["estimated QPU hours (whole run)"] == f"{whole:,.1f}"
    assert any(img["alt"] == "cumulative shots and estimated QPU hours" for img in page.images)


def test_report_bad_quantum_options_are_one_line_exit_2(tmp_path, capsys):
    write_run(tmp_path / "r", config(), [1.0, 2.0])
    assert main(["report", str(tmp_path / "r"), "--qpu", "d-wave"]) == 2
    assert main(["report", str(tmp_path / "r"), "--target", "inf"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--qpu: unknown QPU profile 'd-wave'" in err[0] and "--target" in err[1]


def test_an_interval_never_passes_what_the_seeds_scored():
    """CartPole's returns stop at 500: 496.57 ± 9.38 read as up to 505.95; the interval is clipped."""
    from analysis.report import mean_interval

    finals = np.array([500.0, 500.0, 500.0, 482.85, 500.0, 500.0, 493.14])
    mean = finals.mean()
    half = sps.t.ppf(0.975, 6) * finals.std(ddof=1) / np.sqrt(7)
    assert mean + half > 500.0  # the t-interval alone would pass the maximum
    assert mean_interval(finals, 1.0, 2) == f"{mean:,.2f} [{mean - half:,.2f}, 500.00]"
    assert mean_interval(np.array([3.0, 3.0, np.nan]), 1.0, 1) == "3.0 (2 of 3)"  # alike: no interval
    assert mean_interval(np.array([7.0]), 1.0, 0) == "7"


def test_a_sweep_records_how_many_runs_it_ran_at_once_and_the_report_says_so(tmp_path, monkeypatch):
    """marlq sweep hands its runs MARLQ_SWEEP_JOBS (runs at once); summary.json keeps it as sweep_jobs; the
    results table shows it beside the wall time (— for runs started alone)."""
    import sys

    from marl_q import cli
    from marl_q.runtime import sweep_jobs

    seen = tmp_path / "seen"
    script = f"import os; open({str(seen)!r} + os.environ['MARLQ_SWEEP_JOBS'], 'w')"
    jobs = [(tmp_path / f"c{i}" / "seed0", [sys.executable, "-c", script]) for i in range(3)]
    assert cli._run_pool(jobs, 2) == [] and sorted(p.name for p in tmp_path.glob("seen*")) == ["seen2"]
    assert cli._run_pool(jobs[:1], 4) == [] and (tmp_path / "seen1").exists()  # one run left: 1 at once
    monkeypatch.setenv("MARLQ_SWEEP_JOBS", "2")
    assert sweep_jobs() == {"sweep_jobs": 2}
    monkeypatch.delenv("MARLQ_SWEEP_JOBS")
    assert sweep_jobs() == {}
    for name, summary in (("swept", {"sweep_jobs": 2}), ("alone", {})):
        for seed in range(2):
            run = write_run(tmp_path / "g" / name / f"seed{seed}", config(seed=seed, algorithm__lr=0.1 if name == "alone" else 0.2),
                            np.zeros(20))
            (run / "summary.json").write_text(json.dumps({"status": "completed", "wall_s": 5.0 + seed, **summary}))
    assert main(["report", str(tmp_path / "g"), "--reps", "100"]) == 0
    results = find_table(parse(tmp_path / "g" / "report.html"), "group", "n", "final return (last solve_window episodes)")
    column = results[0].index("runs at once (sweep --jobs)")
    assert sorted(r[column] for r in results[1:]) == ["2", "—"]
    assert "sweep" in (tmp_path / "g" / "report.html").read_text().split("Results per group")[1][:1200]
