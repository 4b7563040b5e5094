"""The one progress bar every marl-q loop shows (a run's budget on every backend, evaluation episodes,
a sweep's runs): ``Progress`` (``RunProgress`` for a run's budget), tqdm underneath, with its rate and
ETA measured from the first progress on.

tqdm's own rate counts the time before the first update: a local or ray run spends its first seconds
starting processes (and importing torch in each), so the first rate was a few steps over that wait and
the ETA a long nonsense figure (``21:12:31`` on a 100k-step run). Here the rate is (progress since the
first update) / (time since it), and until two updates have measured one the rate and ETA show ``?``.
A sweep's bar counts whole runs that all started at once, each with its own start-up: its rate is
(runs done) / (time since the start) (``rate_from="start"``; jobs that finish together would make the
rate since the first one meaningless), ``?`` until a run is done. The elapsed time always counts from
the start. tqdm is imported on first use (``marlq`` starts fast).
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

_BAR_CLASS: Optional[type] = None
_TAP = threading.local()  # tap_runs: this thread's runs' counted work also goes to one shared bar


def _bar_class() -> type:
    """The tqdm subclass (defined on first use, so importing this module does not import tqdm)."""
    global _BAR_CLASS
    if _BAR_CLASS is None:
        from tqdm import tqdm

        class MeasuredBar(tqdm):
            """tqdm whose rate is measured from its first progress on (None, shown as ?, before that)."""

            _first: Optional[tuple[float, float]] = None  # (time, n) at the first progress seen
            rate_from = "first"  # or "start": the rate since the bar started (a pool of runs begun together)

            def _note_first(self) -> None:
                if self._first is None and self.n > self.initial:
                    self._first = (self._time(), self.n)

            def update(self, n: float = 1) -> Optional[bool]:
                if self._first is None and n > 0 and not self.disable:
                    # the first progress: nothing is measured over the wait before it
                    self.n += n
                    self._note_first()
                    self.last_print_n, self.last_print_t = self.n, self._time()
                    self.refresh(lock_args=self.lock_args)
                    return True
                return super().update(n)

            def measured_rate(self) -> Optional[float]:
                """Units per second since the first progress (None until a second one is seen), or since
                the start with ``rate_from="start"`` (None until the first)."""
                self._note_first()  # a bar whose n is set directly (the ray driver's) starts here
                if self._first is None:
                    return None
                t0, n0 = self._first if self.rate_from == "first" else (self.start_t, self.initial)
                dt, dn = self._time() - t0, self.n - n0
                return dn / dt if dt > 0 and dn > 0 else None

            @property
            def format_dict(self) -> dict[str, Any]:
                d = super().format_dict
                if "rate" in d:
                    # 0 rather than None: tqdm replaces a None rate by n / elapsed, the wait included
                    d["rate"] = self.measured_rate() or 0.0
                return d

        _BAR_CLASS = MeasuredBar
    return _BAR_CLASS


def progress_bar(rate_from: str = "first", **kwargs: Any) -> Any:
    """A tqdm bar (same keyword arguments) whose rate and ETA are ``?`` until a rate is measured, from the
    first progress on (``rate_from="first"``) or from the start (``"start"``)."""
    if rate_from not in ("first", "start"):
        raise ValueError(f"rate_from: 'first' or 'start', got {rate_from!r}")
    bar = _bar_class()(**kwargs)
    bar.rate_from = rate_from  # the first line (drawn by tqdm's __init__) has no progress yet: ? either way
    return bar


class Progress:
    """The one progress bar of marl-q's loops: a run's budget (``run_progress``; every backend),
    evaluation episodes (``marl_q.evaluation.eval_progress``) and a sweep's runs (``marlq sweep``). On
    stderr; with ``enabled=False`` or nothing to count it draws nothing and every call is a no-op."""

    def __init__(self, total: Optional[float], unit: str, desc: str, *, enabled: bool = True, initial: float = 0,
                 rate_from: str = "first", **tqdm_kwargs: Any) -> None:
        """``tqdm_kwargs``: tqdm's own (``leave``, ``mininterval``, ``unit_scale``, ``bar_format``, ``file``)."""
        import sys

        self.bar = None
        if enabled and total:
            kwargs = {"file": sys.stderr, "dynamic_ncols": True, **tqdm_kwargs}
            self.bar = progress_bar(rate_from=rate_from, total=total, unit=unit, desc=desc, initial=initial, **kwargs)

    def update(self, n: float = 1) -> None:
        """``n`` more done."""
        if self.bar is not None:
            self.bar.update(n)

    def set(self, n: float, refresh: bool = True, **postfix: Any) -> None:
        """``n`` done in all (a count read from elsewhere, as the ray driver's from the server actor)."""
        if self.bar is not None:
            self.bar.n = n
            self.bar.set_postfix(**postfix, refresh=refresh)

    def postfix(self, text: Optional[str] = None, refresh: bool = False, **values: Any) -> None:
        """The text after the bar: ``text`` as given, or ``key=value`` pairs."""
        if self.bar is not None:
            if text is not None:
                self.bar.set_postfix_str(text, refresh=refresh)
            else:
                self.bar.set_postfix(**values, refresh=refresh)

    def write(self, line: str) -> None:
        """A line above the bar (the bar is redrawn under it)."""
        if self.bar is not None:
            self.bar.write(line, file=self.bar.fp)
        else:
            import sys

            print(line, file=sys.stderr)

    def clear(self) -> None:
        """Wipe the bar's line (before a message is printed; the next update draws it again)."""
        if self.bar is not None:
            self.bar.clear()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class RunProgress(Progress):
    """A run's budget (env steps, else episodes), titled '<algorithm> on <scenario>' (``suffix`` after
    it), with the recent mean return, the latest evaluation's and the server version after the bar: what
    the runtime shows on the sim and local backends, and the ray driver from the server actor's counts."""

    def __init__(self, cfg: Any, env_steps: int = 0, episodes: int = 0, suffix: str = "", **tqdm_kwargs: Any) -> None:
        from marl_q.config import scenario_label

        self.by_steps = cfg.run.total_env_steps is not None
        total = cfg.run.total_env_steps if self.by_steps else cfg.run.total_episodes
        what = scenario_label(cfg.scenario.name, getattr(cfg.scenario.params, "env", None))
        super().__init__(total, "step" if self.by_steps else "ep", f"{cfg.algorithm.name} on {what}{suffix}",
                         initial=env_steps if self.by_steps else episodes, unit_scale=True, **tqdm_kwargs)
        self._recent: list[float] = []
        self._next_postfix = 0.0
        self.eval_return: Optional[float] = None  # the latest eval.csv row's mean, shown beside the return

    def advance(self, env_steps: int, episodes: list[dict[str, Any]], version: int) -> None:
        """``env_steps`` more steps and these finished episodes (rows with their ``return``); the recent
        mean return and the server ``version`` are redrawn once a second."""
        self.update(env_steps if self.by_steps else len(episodes))
        for ep in episodes:
            if "return" in ep:
                self._recent.append(float(ep["return"]))
        now = time.perf_counter()
        if now >= self._next_postfix:
            self._next_postfix = now + 1.0
            self._recent = self._recent[-100:]
            ret = f"{sum(self._recent) / len(self._recent):.1f}" if self._recent else "-"
            extra = {} if self.eval_return is None else {"eval": f"{self.eval_return:.1f}"}
            self.postfix(ret=ret, **extra, v=version)

    def show(self, env_steps: int, episodes: int, version: int) -> None:
        """The counts so far (the ray driver's, read from the server actor once a second)."""
        self.set(env_steps if self.by_steps else episodes, v=version)


def tap_runs(advance: Optional[Callable[[int, int], None]]) -> None:
    """From now on in this thread (None: no more), every run's counted work (``Runtime.record_work``)
    also goes to ``advance(env_steps, episodes)``: the seed-batched team learners run each seed's whole
    single run quietly in a thread of its own, and one bar over all of them counts them here."""
    _TAP.advance = advance


def tapped(env_steps: int, episodes: int) -> None:
    """``Runtime.record_work``'s count, to this thread's tap (``tap_runs``) if it has one."""
    advance = getattr(_TAP, "advance", None)
    if advance is not None:
        advance(env_steps, episodes)
