"""The late policy: a deadline, a grace period and a penalty per started day late.

An archive's receipt time is its file's modification time (what the learning
platform's download or the instructor's copy set; never the manifest's own
claim), the time :class:`attn_course.results.ArchiveResult` records as
``received``.  With deadline ``D``, grace ``g`` and penalty ``p`` (a fraction
of the points per day):

* received at or before ``D + g``: on time, no penalty;
* otherwise ``days = ceil((received - D - g) / 86400)`` (a second late is one
  day late), and the total is multiplied by ``max(0, 1 - min(cap, p * days))``.

The per-exercise scores are never changed (they are the scoring policy's,
:mod:`attn_course.scoring`); only the total carried to the gradebook and the
exports is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

DAY_S = 86400.0


class LatePolicyError(ValueError):
    """A late policy that cannot be used; the message names the value."""


@dataclass(frozen=True)
class Lateness:
    """What the policy says of one archive."""

    days: int  # started days after deadline + grace (0: on time)
    factor: float  # what the total is multiplied by

    def apply(self, total: float) -> float:
        return round(total * self.factor, 4)


@dataclass(frozen=True)
class LatePolicy:
    deadline: float  # seconds since the epoch
    grace_s: float = 0.0
    penalty_per_day: float = 0.0  # a fraction of the total, per started day late
    max_penalty: float = 1.0  # the most the penalty takes away (1: everything)

    def __post_init__(self) -> None:
        for name in ("grace_s", "penalty_per_day", "max_penalty"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise LatePolicyError(f"late policy: {name} must be a finite number >= 0, got {v!r}")
        if self.penalty_per_day > 1 or self.max_penalty > 1:
            raise LatePolicyError("late policy: penalties are fractions of the points, at most 1 (100%)")
        if not math.isfinite(self.deadline) or _local_time(self.deadline) is None:
            raise LatePolicyError(f"late policy: the deadline is not a time this machine can show: {self.deadline!r}")

    @classmethod
    def parse(cls, deadline: str, grace_minutes: float = 0.0, penalty_percent_per_day: float = 0.0,
              max_penalty_percent: float = 100.0) -> "LatePolicy":
        """From the command line: an ISO 8601 deadline with its time zone (``2026-12-01T23:59+01:00``)."""
        try:
            when = datetime.fromisoformat(deadline)
        except ValueError:
            raise LatePolicyError(f"--deadline {deadline!r} is not an ISO 8601 time "
                                  "(e.g. 2026-12-01T23:59:00+01:00)") from None
        if when.tzinfo is None:
            raise LatePolicyError(f"--deadline {deadline!r} has no time zone: add one (e.g. +00:00 or Z), "
                                  "so that it means the same moment on every machine")
        if _local_time(when.timestamp()) is None:
            raise LatePolicyError(f"--deadline {deadline!r} is out of the range of dates (years 1 to 9999) "
                                  "in this machine's time zone")
        _check_option("--grace", grace_minutes, "minutes", 60.0)
        _check_option("--late-penalty", penalty_percent_per_day, "percent per day", 0.01)
        return cls(when.timestamp(), grace_minutes * 60.0, penalty_percent_per_day / 100.0,
                   max_penalty_percent / 100.0)

    def lateness(self, received: float) -> Lateness:
        over = received - (self.deadline + self.grace_s)
        if over <= 0:
            return Lateness(0, 1.0)
        days = math.ceil(over / DAY_S)
        return Lateness(days, max(0.0, 1.0 - min(self.max_penalty, self.penalty_per_day * days)))

    def describe(self) -> str:
        when = _local_time(self.deadline)
        return (f"deadline {when}, grace {self.grace_s / 60:g} min, penalty {self.penalty_per_day * 100:g}% "
                f"per started day late (at most {self.max_penalty * 100:g}%)")


def _local_time(stamp: float) -> str | None:
    """``stamp`` in this machine's time zone (ISO 8601, minutes), or None if no date can show it."""
    try:
        return datetime.fromtimestamp(stamp).astimezone().isoformat(timespec="minutes")
    except (ValueError, OverflowError, OSError):
        return None


def policy_from_options(deadline: str | None, grace_minutes: float = 0.0,
                        penalty_percent_per_day: float = 0.0) -> LatePolicy | None:
    """The late policy of ``attn-course grade``'s options, or None without ``--deadline``.

    A grace or a penalty without a deadline would be silently ignored: it is
    refused instead.
    """
    if deadline is None:
        if grace_minutes or penalty_percent_per_day:
            raise LatePolicyError("--grace and --late-penalty need --deadline (the time they count from)")
        return None
    return LatePolicy.parse(deadline, grace_minutes, penalty_percent_per_day)


def _check_option(flag: str, value: float, unit: str, scale: float) -> None:
    """A command-line number of the policy: finite, >= 0, and still finite in the policy's own unit."""
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0 and math.isfinite(value * scale)):
        raise LatePolicyError(f"{flag} must be a finite number >= 0 ({unit}), got {value!r}")
