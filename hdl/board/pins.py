"""A board's pins by their ``constraints/boards.toml`` names (``"resource:number[.subsignal]"``)."""
from __future__ import annotations

from amaranth.lib import io

__all__ = ["pin_buffers"]


def _pin_spec(spec):
    """``"rgb_led:0.g"`` -> ``("rgb_led", 0, "g")``; ``"led:3"`` -> ``("led", 3, None)``."""
    resource, _, rest = spec.partition(":")
    number, _, sub = rest.partition(".")
    return resource, int(number), (sub or None)


def pin_buffers(m, platform):
    """``pin(spec, direction)``: an ``io.Buffer`` (submodule ``pin_<resource><n>[_<sub>]``
    of ``m``) for the board pin ``"resource:number[.subsignal]"``.

    A resource is requested once, even if several specs use its subsignals (unused
    subsignals stay unbuffered: LEDs off via pull-up).
    """
    requested = {}

    def pin(spec, direction):
        resource, number, sub = _pin_spec(spec)
        if (resource, number) not in requested:
            requested[resource, number] = platform.request(resource, number, dir="-")
        port = requested[resource, number]
        port = getattr(port, sub) if sub else port
        name = f"{resource}{number}" + (f"_{sub}" if sub else "")
        m.submodules[f"pin_{name}"] = buffer = io.Buffer(direction, port)
        return buffer

    return pin
