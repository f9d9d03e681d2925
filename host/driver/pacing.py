"""What a board can hold for the host, and how long the host waits for it.

The board's network front end stores each service's replies whole in an output buffer
(``hdl/net/front_end/egress.py``, ``EgressBuffer``) before they leave; a reply that does not
fit (the transmit path is slow, or held up) is dropped whole and counted as
``drop_reply_full``. The engine never stalls on its output, so the input side drains at the
engine's speed: what limits the host is the output buffer. Its size per service is chosen in
one place, ``contract.network.BufferSizes``, and every board's network top
(``hdl.net.top.NetworkTop``, built by ``hdl/board/network.py``, the Verilated harness and
the TAP board) takes its defaults. :func:`board_buffers` reads them from there (nothing
here copies a number), per board.

A sender keeps the replies it may still get within what the buffer holds
(:func:`reply_beats`, :class:`ReplyBudget`): each outstanding attempt is charged the beats
its largest possible reply takes, and a service answers in order, so a reply to an attempt
proves that every earlier attempt's reply has left the board (or was lost on the way).

Giving up follows the measured round trip: a request is abandoned only after ``retries``
resends without any reply from the service in between and at least
:data:`GIVE_UP_RTTS` smoothed round trips of silence (:func:`give_up_after`); a board that
answers anything meanwhile is slow, not gone, and the request waits on.
"""
from __future__ import annotations

import dataclasses
import functools
import tomllib
from pathlib import Path

from contract.header import BEAT_BYTES
from contract.network import BufferSizes, Service

__all__ = ["ServiceBuffer", "board_buffers", "known_boards", "reply_beats", "ReplyBudget",
           "give_up_after", "GIVE_UP_RTTS", "DEFAULT_BOARD"]

#: silence, in smoothed round trips, before a request may be given up
GIVE_UP_RTTS = 8
#: the board whose buffers a transport assumes unless told (every board has the same today)
DEFAULT_BOARD = "ecpix5"
_NETWORK_TOML = Path(__file__).resolve().parents[2] / "constraints" / "network.toml"
#: BufferSizes field of each service's output buffer
_OUT_FIELD = {Service.NIC_TX: "nic_out", Service.NIC_RX: "nic_out",
              Service.SWITCH: "switch_out", Service.CTRL: "ctrl_out"}


@dataclasses.dataclass(frozen=True)
class ServiceBuffer:
    """One service's output (reply) buffer on a board: ``beats`` of 32 bytes, and at most
    ``packets`` stored replies."""
    beats: int
    packets: int

    @property
    def bytes(self) -> int:
        return self.beats * BEAT_BYTES

    def replies(self, reply_bytes: int, share: int = 1) -> int:
        """Replies of ``reply_bytes`` each that a ``1/share`` part of it holds (at least 1)."""
        return max(1, min(self.beats // share // reply_beats(reply_bytes),
                          self.packets // share))


def known_boards() -> tuple[str, ...]:
    """The boards with a network configuration (``constraints/network.toml``)."""
    with open(_NETWORK_TOML, "rb") as f:
        return tuple(sorted(k for k in tomllib.load(f) if k != "defaults"))


@functools.lru_cache(maxsize=None)
def board_buffers(board: str | None = None) -> dict[Service, ServiceBuffer]:
    """Each service's reply buffer on ``board`` (default :data:`DEFAULT_BOARD`), from the
    gateware's own sizes (the default ``BufferSizes``: no board's top is built with others)."""
    board = DEFAULT_BOARD if board is None else board
    if board not in known_boards():
        raise ValueError(f"no network configuration for board {board!r}; known: "
                         f"{', '.join(known_boards())}")
    sizes = BufferSizes()
    return {service: ServiceBuffer(getattr(sizes, field), sizes.queue)
            for service, field in _OUT_FIELD.items()}


def reply_beats(reply_bytes: int) -> int:
    """Beats a reply of ``reply_bytes`` takes in an output buffer (whole beats, at least
    one: an empty packet is stored as one word)."""
    return max(1, -(-int(reply_bytes) // BEAT_BYTES))


class ReplyBudget:
    """The replies one sender may have coming from one service: at most ``packets`` of
    them, and at most ``beats`` of buffer for their largest possible sizes.

    :meth:`charge` an attempt when it is sent (it returns the attempt's ticket, increasing
    in send order), :meth:`answered` with the ticket of an attempt whose reply arrived: the
    service answers in order, so every attempt sent up to it is then off the board (its
    reply came, or it was lost).
    """

    def __init__(self, buffer: ServiceBuffer, share: int = 1):
        if not isinstance(share, int) or share < 1:
            raise ValueError(f"share must be a positive integer, not {share!r}")
        self.beats = max(1, buffer.beats // share)
        self.packets = max(1, buffer.packets // share)
        self._attempts: list[tuple[int, int]] = []     # (ticket, beats), in send order
        self._tickets = 0
        self.used_beats = 0
        self.peak_beats = self.peak_packets = 0

    def fits(self, beats: int) -> bool:
        """Whether one more attempt of ``beats`` may go (one always may, alone)."""
        if not self._attempts:
            return True
        return (len(self._attempts) < self.packets
                and self.used_beats + beats <= self.beats)

    def charge(self, beats: int) -> int:
        """Count an attempt sent; its ticket."""
        self._tickets += 1
        self._attempts.append((self._tickets, beats))
        self.used_beats += beats
        self.peak_beats = max(self.peak_beats, self.used_beats)
        self.peak_packets = max(self.peak_packets, len(self._attempts))
        return self._tickets

    def answered(self, ticket: int) -> None:
        """A reply to attempt ``ticket`` came: every attempt up to it is done."""
        done = 0
        while done < len(self._attempts) and self._attempts[done][0] <= ticket:
            self.used_beats -= self._attempts[done][1]
            done += 1
        del self._attempts[:done]

    def clear(self) -> None:
        self._attempts.clear()
        self.used_beats = 0

    @property
    def outstanding(self) -> int:
        return len(self._attempts)


def give_up_after(srtt: float | None, floor: float = 0.0) -> float:
    """Seconds of silence from a service after which a request may be given up:
    :data:`GIVE_UP_RTTS` measured round trips, at least ``floor``."""
    return max(floor, GIVE_UP_RTTS * (srtt or 0.0))
