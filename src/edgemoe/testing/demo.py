"""Kept for tests: the demo model lives in `edgemoe.assets.demo` now."""

from __future__ import annotations

from edgemoe.assets.demo import DEMO_CONFIG, DEMO_NAME, DEMO_SEED, demo_model_path

__all__ = ["DEMO_CONFIG", "DEMO_NAME", "DEMO_SEED", "demo_model_path"]
