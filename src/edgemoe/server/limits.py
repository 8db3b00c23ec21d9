"""Bounds on what a request may ask for, checked where the request is parsed.

Every number a client sends is bounded here, so nothing out of range reaches the engine
(a value past 2⁶⁴ cannot even be encoded for it) and every refusal is a 400 naming the
field and the allowed range. `Range` and `StopStrings` are pydantic annotations:

    temperature: Annotated[float, Range(0, 2)] | None = None

They add the bounds to the OpenAPI document (`minimum`/`maximum`), so schemathesis and
clients see them too. The same limits are enforced again by `SamplingParams.validate`
for callers that skip the HTTP layer (`edgemoe.LLM`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from edgemoe.messages import (
    LOGIT_BIAS_LIMIT,
    MAX_LOGIT_BIAS,
    MAX_STOP_BYTES,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    MAX_TOKEN_COUNT,
    SEED_MAX,
    SEED_MIN,
)

__all__ = [
    "MAX_STOP_BYTES",
    "MAX_STOP_STRINGS",
    "MAX_STOP_TOKEN_IDS",
    "MAX_TOKEN_COUNT",
    "SEED_MAX",
    "SEED_MIN",
    "LogitBiasMap",
    "Range",
    "StopStrings",
    "describe_ids",
    "describe_number",
]

# Largest n / best_of: each choice is a whole engine request.
MAX_CHOICES = 64
MAX_LOGPROBS = 20
# Token ids travel as int32 on the device; larger values are never valid ids.
MAX_TOKEN_ID = 2**31 - 1


def describe_number(value: object) -> str:
    """A value for an error message; huge integers are summarised (they may not even print)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    return repr(value) if isinstance(value, float) else str(value)


def describe_ids(ids: list[int]) -> str:
    """The first few of a list of ids, for an error message."""
    shown = ", ".join(describe_number(i) for i in ids[:5])
    return f"[{shown}{', …' if len(ids) > 5 else ''}]"


@dataclass(frozen=True)
class Range:
    """Annotation: the number must lie in [lo, hi] (or (lo, hi] with `lo_open`) and be finite."""

    lo: float
    hi: float
    lo_open: bool = False
    label: str | None = None  # says the range in words (e.g. "a 64-bit signed integer")

    def describe(self) -> str:
        if self.label is not None:
            return self.label
        if self.lo_open:
            return f"greater than {_num(self.lo)} and at most {_num(self.hi)}"
        return f"between {_num(self.lo)} and {_num(self.hi)}"

    def check(self, value: Any) -> Any:
        finite = not isinstance(value, float) or math.isfinite(value)
        above = value > self.lo if self.lo_open else value >= self.lo
        if finite and above and value <= self.hi:
            return value
        raise PydanticCustomError(
            "out_of_range", "must be {allowed} (got {got})",
            {"allowed": self.describe(), "got": describe_number(value)},
        )

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        out = handler(schema)
        out["exclusiveMinimum" if self.lo_open else "minimum"] = self.lo
        out["maximum"] = self.hi
        return out


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


@dataclass(frozen=True)
class StopStrings:
    """Annotation for a `str | list[str]` of stop strings: at most MAX_STOP_STRINGS, each
    non-empty and at most MAX_STOP_BYTES bytes of UTF-8 (the matcher's cost grows with them)."""

    def check(self, value: Any) -> Any:
        stops = [value] if isinstance(value, str) else value
        if len(stops) > MAX_STOP_STRINGS:
            raise PydanticCustomError(
                "too_many_stops", "may hold at most {limit} stop strings (got {count})",
                {"limit": MAX_STOP_STRINGS, "count": len(stops)},
            )
        for stop in stops:
            if not stop:
                raise PydanticCustomError("empty_stop", "may not contain an empty string", {})
            size = len(stop.encode("utf-8", "surrogatepass"))
            if size > MAX_STOP_BYTES:
                raise PydanticCustomError(
                    "stop_too_long", "may only hold strings of at most {limit} bytes of UTF-8 (got one of {size})",
                    {"limit": MAX_STOP_BYTES, "size": size},
                )
        return value

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        out = handler(schema)
        for branch in out.get("anyOf", [out]):
            if branch.get("type") == "array":
                branch["maxItems"] = MAX_STOP_STRINGS
        return out


_DECIMAL = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class LogitBiasMap:
    """Annotation: OpenAI's `logit_bias`, an object of token ids (decimal strings: JSON keys
    are strings) to numbers in [-100, 100], at most MAX_LOGIT_BIAS of them -> {id: bias}.

    Every refusal names `logit_bias` itself, never a key (the client sent one field);
    the ids' vocabulary is checked later, by `SamplingParams.validate`, against the size
    the engine samples over."""

    def check(self, value: Any) -> dict[int, float]:
        if not isinstance(value, dict):
            raise _bias_error("must be an object mapping token ids to numbers (got {got})", _short(value))
        if len(value) > MAX_LOGIT_BIAS:
            raise _bias_error(f"may hold at most {MAX_LOGIT_BIAS} entries (got {{got}})", str(len(value)))
        out: dict[int, float] = {}
        for key, bias in value.items():
            if not isinstance(key, str) or not _DECIMAL.fullmatch(key):
                raise _bias_error("must have token ids written as decimal integers as keys (got {got})", _short(key))
            digits = key.lstrip("0") or "0"  # "007" is token 7, however many zeros lead
            if len(digits) > 10 or int(digits) > MAX_TOKEN_ID:  # 10 digits: int() stays cheap
                raise _bias_error(f"must have token ids of at most {MAX_TOKEN_ID} as keys (got {{got}})", _short(key))
            number = isinstance(bias, (int, float)) and not isinstance(bias, bool)
            # NaN compares false and ±inf is out of range; no float() of a huge integer.
            if not number or not -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT:
                raise _bias_error(f"must map each token id to a number between {-LOGIT_BIAS_LIMIT:g} and "
                                  f"{LOGIT_BIAS_LIMIT:g} (got {{got}} for {_short(key)})", _short(bias))
            if int(digits) in out:  # "1" and "01": one token, two biases
                raise _bias_error("must name each token id once (got {got} twice)", digits)
            out[int(digits)] = float(bias)
        return out

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(self.check)

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        number = {"type": "number", "minimum": -LOGIT_BIAS_LIMIT, "maximum": LOGIT_BIAS_LIMIT}
        return {"type": "object", "maxProperties": MAX_LOGIT_BIAS, "propertyNames": {"pattern": "^[0-9]+$"},
                "additionalProperties": number}


def _bias_error(template: str, got: str) -> PydanticCustomError:
    return PydanticCustomError("logit_bias", template, {"got": got})


def _short(value: object) -> str:
    """A JSON value for an error message, short however large it is (no repr of it whole)."""
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else repr(value[:40]) + "…"
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, (int, float)):
        return describe_number(value)
    return {dict: "an object", list: "an array"}.get(type(value), type(value).__name__)
