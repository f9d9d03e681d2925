"""Round-trip estimation and resend timers, shared by every UDP sender of the host.

Timeouts follow the measured round trip (RFC 6298: smoothed RTT plus four deviations)
and back off exponentially while the board is silent; :func:`retries_for_loss` sizes the
retry limit for a given datagram loss rate.
"""
from __future__ import annotations

import dataclasses
import math

__all__ = ["RttEstimator", "ResendTimer", "retries_for_loss"]


class RttEstimator:
    """Retransmission timeout from measured round trips (RFC 6298): smoothed RTT plus four
    deviations, within ``[minimum, maximum]``, doubled by :meth:`backoff`."""

    def __init__(self, initial: float, minimum: float, maximum: float):
        self.minimum, self.maximum = minimum, maximum
        self.rto = min(max(initial, minimum), maximum)
        self.srtt = self.rttvar = None

    def sample(self, rtt: float) -> None:
        """Fold one measured round trip (seconds) into the estimate."""
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt
        self.rto = min(max(self.srtt + 4 * self.rttvar, self.minimum), self.maximum)

    @property
    def measured(self) -> float | None:
        """Smoothed RTT plus four deviations, without the bounds or any backoff (None before
        the first sample): how long a reply may take that is merely slow."""
        return None if self.srtt is None else self.srtt + 4 * self.rttvar

    def backoff(self) -> None:
        """Double the timeout (up to the maximum): nothing came back at all."""
        self.rto = min(self.rto * 2, self.maximum)


def retries_for_loss(loss: float, *, failure: float = 1e-12, least: int = 8) -> int:
    """Resends that make a request fail with probability below ``failure`` when each
    datagram is lost with probability ``loss`` (the request or its reply: two chances)."""
    if not 0.0 <= loss < 1.0:
        raise ValueError(f"loss must be in [0, 1), not {loss!r}")
    attempt_fails = 1.0 - (1.0 - loss) ** 2
    if attempt_fails == 0.0:
        return least
    return max(least, math.ceil(math.log(failure) / math.log(attempt_fails)) - 1)


@dataclasses.dataclass
class ResendTimer:
    """A request waiting for its reply, or a worker waiting for a result: when it was
    sent, when it is due again, and how often it went."""
    item: object              # the request's index, or the packet the worker resends
    sent: float               # first attempt
    last_sent: float
    timeout: float
    attempt: int = 0
    need: int = 1             # copies still to come (a worker may await two results)
    strikes: int = 0          # timeouts in a row with nothing at all from the board between

    @property
    def deadline(self) -> float:
        return self.last_sent + self.timeout
