"""The one progress bar every marl-q loop shows (a run's budget on every backend, evaluation episodes,
a sweep's runs): tqdm, with its rate and ETA measured from the first progress on.

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

from typing import Any, Optional

_BAR_CLASS: Optional[type] = None


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
