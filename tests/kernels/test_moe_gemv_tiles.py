"""The fused MoE decode kernel's tile settings (Triton-free): the override's parsing (tiles,
split-K, stages) and the split-K column ranges."""

from __future__ import annotations

import pytest

from edgemoe.kernels import moe_gemv_tiles
from edgemoe.kernels.moe_gemv_tiles import split_cols, tiles


def test_override_takes_six_seven_or_nine_values(monkeypatch: pytest.MonkeyPatch) -> None:
    default = moe_gemv_tiles.DEFAULT
    monkeypatch.setenv(moe_gemv_tiles.ENV, "8,256,2,32,64,8")
    assert tiles() == (8, 256, 2, 32, 64, 8, default.gu_splits, default.gu_stages, default.down_stages)
    monkeypatch.setenv(moe_gemv_tiles.ENV, "8,256,2,32,64,8,3")  # the split; stages keep their defaults
    assert tiles() == (8, 256, 2, 32, 64, 8, 3, default.gu_stages, default.down_stages)
    monkeypatch.setenv(moe_gemv_tiles.ENV, "8,256,2,32,64,8,1,3,2")
    assert tiles() == (8, 256, 2, 32, 64, 8, 1, 3, 2) and (tiles().gu_stages, tiles().down_stages) == (3, 2)
    for bad in ("8,256,2,32,64", "8,256,2,32,64,8,0", "8,256,2,32,64,8,2,1", "8,256,2,32,64,8,1,0,1",
                "8,256,2,32,64,8,1,2,2,2"):
        monkeypatch.setenv(moe_gemv_tiles.ENV, bad)
        with pytest.raises(ValueError, match="6, 7 or 9 positive integers"):
            tiles()
    for bad, why in (("8,96,2,32,64,8", "powers of two"), ("8,x,2,32,64,8", "integers")):
        monkeypatch.setenv(moe_gemv_tiles.ENV, bad)
        with pytest.raises(ValueError, match=why):
            tiles()
    monkeypatch.delenv(moe_gemv_tiles.ENV)
    assert tiles() == default and default.gu_splits == moe_gemv_tiles.GU_SPLITS == 1
    assert (default.gu_stages, default.down_stages) == (1, 1)  # no pipelining until a sweep shows it pays


@pytest.mark.parametrize("H", [40, 75, 2048, 2049, 4096])
@pytest.mark.parametrize("splits", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("cols", [16, 128])
def test_splits_cover_h_in_whole_tiles(H: int, splits: int, cols: int) -> None:
    c = split_cols(H, splits, cols)
    assert c % cols == 0  # every split starts on a tile boundary
    assert splits * c >= H  # together they cover [0, H)
    assert splits * (c - cols) < H  # with the fewest tiles per split that can
