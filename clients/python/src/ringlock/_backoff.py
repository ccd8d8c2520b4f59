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


class Reconnects:
    """One connection's place in the schedule: the attempts since it last
    worked.

    A connection that answered something, or stayed open for as long as the
    longest pause, worked, and the schedule starts over. One closed at once
    after its connect (a server refusing connections, a listener of a
    killed process) did not, or the client would reconnect to it in a
    tight loop; neither did a connect that failed, a TLS handshake that
    failed or a refused secret.

    Example::

        >>> schedule = Reconnects(0.05, 3.0)
        >>> schedule.pause(1.0), schedule.pause(1.0), schedule.pause(1.0)
        (0.0, 0.05, 0.1)
        >>> schedule.session_ended(replied=True, open_for=0.01)
        >>> schedule.pause(1.0)
        0.0
    """

    __slots__ = ("attempt", "first", "maximum")

    def __init__(self, first: float, maximum: float) -> None:
        self.first = first
        self.maximum = maximum
        self.attempt = 0

    def pause(self, draw: float) -> float:
        """The pause before the next attempt, ``draw`` in ``[0, 1)``; counts the attempt."""
        pause = reconnect_delay(self.attempt, self.first, self.maximum, draw)
        self.attempt += 1
        return pause

    def session_ended(self, replied: bool, open_for: float) -> None:
        """A socket that was up for ``open_for`` seconds ended; ``replied``
        if it answered anything."""
        if replied or open_for >= self.maximum:
            self.attempt = 0
