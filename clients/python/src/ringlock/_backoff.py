"""The reconnect schedule of a broken connection (docs/protocol.md §4): at
once, then after doubling delays from a first delay up to a cap, each drawn
at random in its upper half, so that many clients cut at the same moment do
not come back at the same moment.

:func:`reconnect_delay` is a pure function of the attempt number and a
random draw; the connections count the attempts and draw.
"""

from __future__ import annotations

import math


def reconnect_delay(attempt: int, first: float, maximum: float, draw: float) -> float:
    """The pause in seconds before reconnect attempt ``attempt`` (0 for the
    first attempt after a connection broke or a connect failed), given
    ``draw`` in ``[0, 1)``.

    Attempt 0 goes at once. Attempt ``n >= 1`` waits a delay drawn in
    ``[d/2, d]``, where ``d`` is ``first`` doubled ``n - 1`` times and capped
    at ``maximum``: with the defaults (0.05 s, 3 s), 25-50 ms, 50-100 ms,
    100-200 ms, ... and 1.5-3 s from the eighth attempt on.

    Example::

        >>> reconnect_delay(0, 0.05, 3.0, 0.7)
        0.0
        >>> reconnect_delay(3, 0.05, 3.0, 1.0)
        0.2
        >>> reconnect_delay(30, 0.05, 3.0, 0.0)
        1.5
    """
    if attempt <= 0:
        return 0.0
    # Past 2**31 any first delay is beyond any sensible cap.
    ceiling = min(first * 2.0 ** min(attempt - 1, 31), maximum)
    if not math.isfinite(draw):
        draw = 0.0
    draw = min(max(draw, 0.0), 1.0)
    return ceiling / 2 + ceiling / 2 * draw
