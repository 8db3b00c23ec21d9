"""Token masks through page-locked staging (`engine/mask_upload.py`): the device's rows are
the host's masks, step after step, while the staging buffers alternate, grow, and are
overwritten for the next step before the device has run the last one's copies."""

from __future__ import annotations

import numpy as np
import torch

from edgemoe.engine.mask_upload import MaskUpload

WIDTH = 151936


def test_rows_equal_the_host_masks_across_turns_and_growth() -> None:
    rng = np.random.default_rng(0)
    upload, device = MaskUpload(WIDTH), torch.device("cuda")
    outs, wants = [], []
    for step, rows in enumerate([1, 3, 3, 8, 2, 16, 1]):
        torch.cuda._sleep(2_000_000)  # the stream busy: copies queue behind it, the host runs on
        masks = [rng.random(WIDTH) < 0.3 if (step + i) % 3 else None for i in range(rows)]
        wants.append(np.stack([np.ones(WIDTH, bool) if m is None else m.copy() for m in masks]))
        outs.append(upload.rows(masks, device))
        for m in masks:  # the host reuses its arrays at once: staging must hold its own copy
            if m is not None:
                m[:] = False
    torch.cuda.synchronize()
    for got, want in zip(outs, wants, strict=True):
        assert torch.equal(got.cpu(), torch.from_numpy(want))


def test_rows_hold_each_steps_values() -> None:
    rng = np.random.default_rng(1)
    upload, device = MaskUpload(WIDTH), torch.device("cuda")
    outs, wants = [], []
    for step in range(6):
        torch.cuda._sleep(1_000_000)
        masks = [rng.random(WIDTH) < 0.5, None, rng.random(WIDTH) < 0.1]
        wants.append(np.stack([masks[0], np.ones(WIDTH, bool), masks[2]]))
        outs.append(upload.rows([m.copy() if m is not None else None for m in masks], device))
    torch.cuda.synchronize()
    for got, want in zip(outs, wants, strict=True):
        assert torch.equal(got.cpu(), torch.from_numpy(want))


def test_a_kept_mask_travels_once() -> None:
    upload, device = MaskUpload(WIDTH), torch.device("cuda")
    after = np.zeros(WIDTH, bool)
    after[[5, 77, 151000]] = True
    first, again = upload.kept(after, device), upload.kept(after, device)
    assert first.data_ptr() == again.data_ptr()
    assert torch.equal(first.cpu(), torch.from_numpy(after))
    assert upload.kept(after.copy(), device).data_ptr() != first.data_ptr()  # another array: its own copy
