"""What the engine says at start-up about settings past what the model was made for."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from edgemoe.engine.build import warn_about_plan

ARCH = SimpleNamespace(max_position_embeddings=4096, moe_layers=(0, 1), moe_pairs=2)
PLAN = SimpleNamespace(kv_tokens=1 << 20, num_slots=0)


@pytest.mark.parametrize("max_len,said", [(4096, False), (100_000, True)])
def test_a_context_past_the_models_positions_is_said(max_len: int, said: bool,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """--max-model-len past max_position_embeddings was taken silently (with dynamic NTK the
    positions past it even differ from transformers', which rescales per forward)."""
    with caplog.at_level(logging.WARNING, logger="edgemoe.engine.build"):
        warn_about_plan(PLAN, ARCH, max_len)  # type: ignore[arg-type]
    assert ("past the 4096 positions the model serves" in caplog.text) is said
