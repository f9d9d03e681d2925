"""What one call of the collectives sent from this rank: :class:`CallStats`.

Every exchange function of :mod:`host.ddp.collectives` returns one with its sum; the DDP hooks
(:mod:`host.ddp.hooks`) append it to ``hook.calls`` (with DDP's bucket index) and add its byte
counts to theirs, and FSDP2's reduce-scatter objects (:mod:`host.fsdp.reduce_scatter`) keep
them the same way. What the byte counts include (payload, framing, the preflight) is in
:mod:`host.ddp.collectives`' docstring, what ``hardware`` counts in :mod:`host.ddp.hardware`'s.
"""
import dataclasses

__all__ = ["CallStats"]


@dataclasses.dataclass
class CallStats:
    """What one hook call (one bucket of one step) sent from this rank.

    Attributes
    ----------
    bucket_index : int
        DDP's bucket index (``-1`` when called outside DDP).
    numel : int
        Values in the bucket.
    bytes_sent : int
        Payload bytes this rank sent (compressed streams, index, sketch, fallback...).
    dense_ring_bytes : int
        Bytes this rank would send in a plain fp32 ring all-reduce of the same bucket.
    control_bytes : int
        Framing this rank sent on top of ``bytes_sent`` (length words; with a NIC the wire
        packets' headers; with a hardware backend the call's status word).
    details : dict
        Codec-specific numbers (see each hook).
    backend : str
        What computed the call: ``"golden"``, or the hardware backend and its address.
    seconds : float
        Wall time of the whole call on this rank.
    path_seconds : float
        The part of it in the path a backend replaces: the codec (golden model or NIC
        exchanges) of the ring, the three aggregation phases (gloo collectives or the
        switch's rounds) of the sketch. For the NIC, the ring's messages between ranks
        (gloo) are outside it; for the switch, the wait for the slowest rank is inside.
    hardware : dict
        What this call sent through the hardware (empty with the golden models): the NIC's
        packets and bytes per path, or the switch worker's packets, resends and bytes.
    """

    bucket_index: int
    numel: int
    bytes_sent: int
    dense_ring_bytes: int
    control_bytes: int = 0
    details: dict = dataclasses.field(default_factory=dict)
    backend: str = "golden"
    seconds: float = 0.0
    path_seconds: float = 0.0
    hardware: dict = dataclasses.field(default_factory=dict)
