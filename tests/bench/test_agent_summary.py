"""`bench agent`'s closing lines: the prefilled share after the first turn, and a session
that ended before any turn (a prompt longer than the context) reported, not a crash."""

from __future__ import annotations

from edgemoe.bench.agent import session_summary


def test_summary_gives_the_share_prefilled_after_the_first_turn() -> None:
    rows = [{"turn": 0, "prompt_tokens": 1000, "prefilled_tokens": 1000, "ttft_s": 1.0},
            {"turn": 1, "prompt_tokens": 1200, "prefilled_tokens": 200, "ttft_s": 0.2},
            {"turn": 2, "prompt_tokens": 1300, "prefilled_tokens": 100, "ttft_s": 0.3}]
    line = session_summary(rows)
    assert line.startswith("prefilled 1300 of 3500 prompt tokens (12.0% in turns after the first)")
    assert line.endswith("mean TTFT 0.500s")


def test_summary_of_a_session_without_a_turn() -> None:
    assert session_summary([]) == "no turn completed (see the message above)"
