"""The fused MoE decode kernel's tile settings (Triton-free): the override's parsing and
the split-K column ranges."""

from __future__ import annotations

import pytest

from edgemoe.kernels import moe_gemv_tiles
from edgemoe.kernels.moe_gemv_tiles import split_cols, tiles


def test_override_takes_six_or_seven_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(moe_gemv_tiles.ENV, "8,256,2,32,64,8")
    assert tiles() == (8, 256, 2, 32, 64, 8, moe_gemv_tiles.GU_SPLITS)  # the split keeps its default
    monkeypatch.setenv(moe_gemv_tiles.ENV, "8,256,2,32,64,8,3")
    assert tiles().gu_splits == 3 and tiles().down_cols == 64
    for bad in ("8,256,2,32,64", "8,256,2,32,64,8,0", "8,256,2,32,64,8,2,1"):
        monkeypatch.setenv(moe_gemv_tiles.ENV, bad)
        with pytest.raises(ValueError, match="6 or 7 positive integers"):
            tiles()
    monkeypatch.delenv(moe_gemv_tiles.ENV)
    assert tiles().gu_splits == moe_gemv_tiles.GU_SPLITS == 1


@pytest.mark.parametrize("H", [40, 75, 2048, 2049, 4096])
@pytest.mark.parametrize("splits", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("cols", [16, 128])
def test_splits_cover_h_in_whole_tiles(H: int, splits: int, cols: int) -> None:
    c = split_cols(H, splits, cols)
    assert c % cols == 0  # every split starts on a tile boundary
    assert splits * c >= H  # together they cover [0, H)
    assert splits * (c - cols) < H  # with the fewest tiles per split that can
