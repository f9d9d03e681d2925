"""One job over several boards: which chunks of a vector go to which board.

``docs/protocol/network.md`` section 3, "Several boards, one job": a worker's vector is
cut into chunks of ``lanes`` words (consecutive slot-sized pieces, in order, the last one
shorter); chunk ``c`` goes to board ``c mod B``, where it is that board's chunk
``c div B``. Board ``b`` therefore sees the concatenation of chunks ``b, b + B, b + 2B,
...`` as its own message, packetised as one board packetises any message (its slots and
versions follow from its own chunk numbers), and aggregates it on its own. The workers put
the boards' results back together by chunk.

Only the last chunk of the whole vector may be short, and it is the last chunk of its
board's part too, so every board's part is cut into exactly the chunks it was given: the
aggregate of the parts, put back together, is bit for bit the aggregate of the whole
vector on one board (OR and wrap-around ADD work word by word).

:func:`split` and :func:`join` are the two directions; :func:`board_chunks` says how many
chunks each board gets (boards past the vector's last chunk get none and send nothing).
"""
from __future__ import annotations

import numpy as np

__all__ = ["split", "join", "board_chunks", "check_boards"]


def check_boards(boards) -> int:
    if isinstance(boards, bool) or not isinstance(boards, (int, np.integer)) or boards < 1:
        raise ValueError(f"boards must be a positive integer, not {boards!r}")
    return int(boards)


def _chunks(size: int, lanes: int) -> int:
    if isinstance(lanes, bool) or int(lanes) != lanes or lanes < 1:
        raise ValueError(f"lanes must be a positive integer, not {lanes!r}")
    return -(-size // lanes)


def board_chunks(size: int, lanes: int, boards: int) -> list[int]:
    """Chunks of a ``size``-word vector that each of ``boards`` boards aggregates."""
    boards = check_boards(boards)
    chunks = _chunks(size, lanes)
    return [len(range(b, chunks, boards)) for b in range(boards)]


def split(words, lanes: int, boards: int) -> list[np.ndarray]:
    """Board ``b``'s part of ``words``: chunks ``b, b + boards, ...`` of ``lanes`` words,
    concatenated (the vector's last, short chunk stays short). One board: the vector."""
    boards = check_boards(boards)
    words = np.ascontiguousarray(words).reshape(-1)
    if boards == 1:
        return [words]
    size = words.size
    chunks = _chunks(size, lanes)
    full = size // lanes
    body = words[:full * lanes].reshape(full, lanes)
    parts = []
    for b in range(boards):
        part = body[b::boards].reshape(-1)
        if full < chunks and (chunks - 1) % boards == b:
            part = np.concatenate([part, words[full * lanes:]])
        parts.append(np.ascontiguousarray(part))
    return parts


def join(parts, size: int, lanes: int) -> np.ndarray:
    """The vector of ``size`` words whose :func:`split` over ``len(parts)`` boards is
    ``parts`` (each at least as long as its board's share: longer parts are cut)."""
    parts = [np.asarray(p).reshape(-1) for p in parts]
    boards = check_boards(len(parts))
    if boards == 1:
        return parts[0][:size]
    chunks = _chunks(size, lanes)
    full = size // lanes
    dtype = np.result_type(*[p.dtype for p in parts])
    out = np.empty(size, dtype=dtype)
    body = out[:full * lanes].reshape(full, lanes)
    for b, part in enumerate(parts):
        share = len(range(b, chunks, boards))
        whole = len(range(b, full, boards))
        need = whole * lanes + (size - full * lanes if share > whole else 0)
        if part.size < need:
            raise ValueError(f"board {b}'s part holds {part.size} words, fewer than the "
                             f"{need} of its {share} chunk(s) of the {size}-word vector")
        body[b::boards] = part[:whole * lanes].reshape(whole, lanes)
        if share > whole:
            out[full * lanes:] = part[whole * lanes:need]
    return out
