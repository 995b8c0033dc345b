"""The demo's traffic story, phase by phase (pure data).

Steady chat, then a wave of long prompts over that chat (TTFT rises, prefill scales up,
decode's TPOT stays flat, while a colocated model's TPOT jumps), then long generations (decode
scales up), then quiet (both scale down).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class Phase:
    """One stretch of traffic."""

    name: str
    title: str
    rate: float
    """Requests per second (0: no traffic)."""
    seconds: float
    prompt_tokens: int
    max_tokens: int
    expect: str
    """What the user should see happen."""
    over_chat: bool = False
    """Steady chat goes on underneath (the first phase's traffic), as it would in a service."""


STORIES: Final[dict[str, tuple[Phase, ...]]] = {
    "full": (
        Phase("chat", "steady chat", 2, 40, 600, 48, "both pools hold at one replica"),
        Phase(
            "long-prompts",
            "a wave of 12k-token prompts over the chat",
            3,
            45,
            12_000,
            8,
            "TTFT rises, prefill scales up, decode's TPOT stays flat; colocated TPOT jumps",
            over_chat=True,
        ),
        Phase(
            "long-outputs", "long generations", 3, 40, 100, 400, "decode scales up, prefill stays"
        ),
        Phase("quiet", "quiet", 0, 100, 0, 0, "both pools scale back down"),
    ),
    "short": (
        Phase("chat", "steady chat", 2, 10, 600, 24, "both pools hold at one replica"),
        Phase(
            "long-prompts",
            "a wave of 12k-token prompts over the chat",
            3,
            35,
            12_000,
            8,
            "TTFT rises, prefill scales up, decode's TPOT stays flat; colocated TPOT jumps",
            over_chat=True,
        ),
        Phase(
            "long-outputs", "long generations", 3, 35, 100, 400, "decode scales up, prefill stays"
        ),
        Phase("quiet", "quiet", 0, 100, 0, 0, "both pools scale back down"),
    ),
}
