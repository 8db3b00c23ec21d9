"""On/off environment switches (edgemoe/env_switch.py): the words people write for on and
off, any case; unset or empty the default; anything else refused naming the variable — and
the knobs read through it (`EDGEMOE_TRITON=off` turns the kernels off, where "off" was on)."""

from __future__ import annotations

import pytest
import torch

from edgemoe.env_switch import env_switch


@pytest.mark.parametrize("raw,want", [("1", True), ("on", True), ("TRUE", True), (" yes ", True),
                                      ("0", False), ("Off", False), ("false", False), ("NO", False)])
def test_the_words_for_on_and_off(raw: str, want: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEMOE_SOME_SWITCH", raw)
    assert env_switch("EDGEMOE_SOME_SWITCH", not want) is want


@pytest.mark.parametrize("default", [True, False])
def test_unset_or_empty_is_the_default(default: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDGEMOE_SOME_SWITCH", raising=False)
    assert env_switch("EDGEMOE_SOME_SWITCH", default) is default
    monkeypatch.setenv("EDGEMOE_SOME_SWITCH", "")
    assert env_switch("EDGEMOE_SOME_SWITCH", default) is default


@pytest.mark.parametrize("raw", ["2", "maybe", "o", "-1", "enabled"])
def test_anything_else_is_refused_by_name(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEMOE_SOME_SWITCH", raw)
    with pytest.raises(ValueError, match=f"EDGEMOE_SOME_SWITCH='{raw}'"):
        env_switch("EDGEMOE_SOME_SWITCH", True)


def test_the_triton_switch_reads_off_as_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from edgemoe.kernels.backend import use_triton

    monkeypatch.setenv("EDGEMOE_TRITON", "off")
    assert not use_triton(torch.zeros(1))
    monkeypatch.setenv("EDGEMOE_TRITON", "nope")
    with pytest.raises(ValueError, match="EDGEMOE_TRITON"):
        use_triton(torch.zeros(1))
