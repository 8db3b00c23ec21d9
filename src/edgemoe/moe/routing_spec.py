"""What `--routing` names, parsed without torch (the config validates it; the server
refuses synthetic routing before any engine starts). The process itself:
`moe/synthetic_routing.py`."""

from __future__ import annotations

from dataclasses import dataclass, replace

WINDOW = 8  # tokens of history the `window` statistic looks back over
PREFIX = "synthetic"
ROUTER = "router"
KEYS = ("seed", "repeat", "window", "top", "recall", "precision")


@dataclass(frozen=True)
class RoutingSpec:
    """What `--routing synthetic:…` asks for: targets, the seed, and decode prefetch's
    predictor's recall (1: the drawn ids, an oracle; below 1: `moe/noisy_prediction.py`)."""

    seed: int = 0
    repeat: float = 0.45
    window: float = 0.80
    top: float = 0.05
    recall: float = 1.0
    precision: float | None = None  # None: recall's (a guess of K experts, the router's top-k)

    @property
    def label(self) -> str:
        guess = f",recall={self.recall:g}" if self.recall < 1 else ""  # the oracle's label as it always was
        guess += f",precision={self.precision:g}" if self.precision is not None else ""
        return f"{PREFIX}:seed={self.seed},repeat={self.repeat:g},window={self.window:g},top={self.top:g}{guess}"


def parse_routing(text: str) -> RoutingSpec | None:
    """`router` → None (the model's own router);
    `synthetic[:seed=…,repeat=…,window=…,top=…,recall=…,precision=…]` → its spec; anything else
    → ValueError naming the setting."""
    if text == ROUTER:
        return None
    head, _, rest = text.partition(":")
    if head != PREFIX:
        raise ValueError(f"routing (--routing) {text!r}: router or "
                         "synthetic[:seed=N,repeat=F,window=F,top=F,recall=F,precision=F]")
    spec = RoutingSpec()
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        if key not in KEYS:
            raise ValueError(f"routing (--routing): unknown key {key!r} ({', '.join(KEYS)})")
        try:
            spec = replace(spec, **{key: int(value) if key == "seed" else float(value)})
        except ValueError:
            raise ValueError(f"routing (--routing): {key}={value!r} is not a number") from None
    if not (0 < spec.top <= 1 and 0 <= spec.repeat <= spec.window <= 1 and 0 <= spec.recall <= 1):
        raise ValueError(f"routing (--routing): need 0 < top <= 1, 0 <= repeat <= window <= 1 and 0 <= recall <= 1 "
                         f"({text!r})")
    if spec.precision is not None and not (0 < spec.precision <= 1 and spec.recall <= spec.precision):
        raise ValueError(f"routing (--routing): need recall <= precision <= 1 (a guess of at most K experts; "
                         f"{text!r})")
    return spec
