"""The quantised decode GEMV's tile settings (Triton-free): the per-format override's
parsing, the sub-tile widths, and the scale pieces lying within one group."""

from __future__ import annotations

import pytest

from edgemoe.kernels import moe_gemv_q_tiles
from edgemoe.kernels.moe_gemv_q_tiles import DEFAULTS, env_name, scale_cols, sub_cols, tiles
from edgemoe.quant import EXPERT_DTYPES


def test_every_quantised_format_has_default_tiles() -> None:
    assert set(DEFAULTS) == set(EXPERT_DTYPES) - {"auto", "bf16"}


def test_override_is_per_format_and_takes_six_or_eight_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env_name("fp8"), "8,512,2,32,64,8")
    assert env_name("fp8") == "EDGEMOE_MOE_GEMV_Q_TILES_FP8"
    assert tiles("fp8") == (8, 512, 2, 32, 64, 8, DEFAULTS["fp8"].gu_stages, DEFAULTS["fp8"].down_stages)
    assert tiles("int4") == DEFAULTS["int4"]  # another format's variable is not read
    monkeypatch.setenv(env_name("fp8"), "8,512,2,32,64,8,3,2")
    assert tiles("fp8").gu_stages == 3 and tiles("fp8").down_stages == 2
    for bad, why in (("8,512,2,32,64", "6 or 8"), ("8,512,2,32,64,8,3", "6 or 8"), ("8,512,2,32,64,8,0,1", "6 or 8"),
                     ("8,384,2,32,64,8", "powers of two"), ("8,4,2,32,64,8", "at least 8"), ("8,x,2,32,64,8", "integers")):
        monkeypatch.setenv(env_name("fp8"), bad)
        with pytest.raises(ValueError, match=why):
            tiles("fp8")
    monkeypatch.delenv(env_name("fp8"))
    assert tiles("fp8") == DEFAULTS["fp8"]


@pytest.mark.parametrize("rows", [1, 8, 16, 32, 64])
@pytest.mark.parametrize("warps", [1, 2, 4, 8])
@pytest.mark.parametrize("cols", [8, 64, 256, 1024])
def test_sub_tiles_divide_the_step(rows: int, warps: int, cols: int) -> None:
    for nibbles in (False, True):
        sub = sub_cols(cols, rows, warps, nibbles)
        assert sub & (sub - 1) == 0 and cols % sub == 0 and sub <= moe_gemv_q_tiles.SUB_MAX
        assert sub >= (8 if nibbles else 1)  # a whole int32 word of codes
    # nibbles: a thread unpacks one word, 8 codes, wherever the step and SUB_MAX leave room
    # for it (the activations' 16-byte loads hold 8 bf16: the same layout, no shuffle)
    fits = 8 * rows <= 8 * 32 * warps <= rows * min(cols, moe_gemv_q_tiles.SUB_MAX)
    if fits:
        assert rows * sub_cols(cols, rows, warps, True) == 8 * 32 * warps
    assert sub_cols(cols, rows, warps, False) == min(cols, moe_gemv_q_tiles.SUB_MAX)


@pytest.mark.parametrize("group", [1, 8, 16, 32, 96, 128, 200, 256])
@pytest.mark.parametrize("sub", [8, 16, 64, 128])
def test_scale_pieces_lie_within_one_group(group: int, sub: int) -> None:
    gw = scale_cols(sub, group)
    assert sub % gw == 0
    for k0 in range(0, 4 * max(group, sub), sub):  # sub-tiles start at multiples of sub
        for p in range(k0, k0 + sub, gw):
            assert p // group == (p + gw - 1) // group  # a piece's columns share a group
    assert scale_cols(sub, None) == sub  # one scale a row (int8): the whole sub-tile
