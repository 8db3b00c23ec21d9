"""`edgemoe ctl health|stats|requests`: a running server's state, printed for a person.

Reads `/health`, `/v1/stats` and `/v1/requests` over HTTP (httpx; no torch), so it
works against any edgemoe server the caller can reach. Exit status: 0 when the server
answered and is healthy, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import httpx

DEFAULT_URL = "http://127.0.0.1:1919"
TIMEOUT_S = 10.0


def add_ctl_parser(sub: Any) -> None:
    """The `ctl` subcommand (`sub`: the CLI's subparsers)."""
    ctl = sub.add_parser("ctl", help="a running server's health, stats and recent requests")
    ctl.add_argument("what", choices=("health", "stats", "requests"))
    ctl.add_argument("--url", default=os.environ.get("EDGEMOE_URL", DEFAULT_URL),
                     help=f"the server: a URL or host:port (default: $EDGEMOE_URL or {DEFAULT_URL})")
    ctl.add_argument("--api-key", default=os.environ.get("EDGEMOE_API_KEY"),
                     help="the server's --api-key (default: $EDGEMOE_API_KEY)")
    ctl.add_argument("--limit", type=int, default=20, help="requests: how many to list")


def server_url(text: str) -> str:
    """A server's base URL from what a person types: `http://host:port`, `host:port`, `:port`
    or a bare port (`1919`); no trailing slash. ValueError (naming --url) for no address."""
    given, text = text, text.strip()
    if (bare := text.rstrip("/")).isdigit() or bare.startswith(":"):
        text = "127.0.0.1:" + bare.lstrip(":")
    if "://" not in text:
        text = "http://" + text
    text = text.rstrip("/")
    try:
        url, why = httpx.URL(text), "no host"
    except httpx.InvalidURL as exc:
        url, why = None, str(exc)
    if url is not None and url.port is not None and not 0 < url.port <= 65535:  # httpx takes 70000, -1
        url, why = None, f"port {url.port} is not in 1..65535"
    if url is None or url.scheme not in ("http", "https") or not url.host:
        why = f"scheme {url.scheme}://" if url is not None and url.host else why
        raise ValueError(f"--url {given!r} is not a server address ({why}): e.g. 127.0.0.1:1919 or http://HOST:PORT")
    return text


def run_ctl(args: argparse.Namespace) -> int:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    paths = {"health": "/health", "stats": "/v1/stats", "requests": f"/v1/requests?limit={args.limit}"}
    args.url = server_url(args.url)
    url = args.url + paths[args.what]
    try:
        r = httpx.get(url, headers=headers, timeout=TIMEOUT_S)
    except httpx.HTTPError as exc:
        print(f"edgemoe ctl: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1
    body = _json(r)
    if r.status_code != 200:
        error = body.get("error") if isinstance(body, dict) else None
        message = error.get("message") if isinstance(error, dict) else error
        print(f"{'unavailable' if r.status_code == 503 else 'error'} ({r.status_code}): {message or r.text}")
        return 1
    try:
        text = {"health": format_health, "stats": format_stats, "requests": format_requests}[args.what](body)
    except (KeyError, TypeError, AttributeError, ValueError) as exc:  # another server (or none) at --url
        print(f"edgemoe ctl: {url} did not answer as an edgemoe server does (--url; {type(exc).__name__}: {exc})",
              file=sys.stderr)
        return 1
    print(text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edgemoe")
    add_ctl_parser(parser.add_subparsers(dest="command", required=True))
    return run_ctl(parser.parse_args(argv))


def _json(r: httpx.Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return None


# --------------------------------------------------------------------------- formatting


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    minutes, s = divmod(int(seconds), 60)
    hours, m = divmod(minutes, 60)
    return f"{hours}h{m:02d}m" if hours else f"{m}m{s:02d}s"


def size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def format_health(body: dict[str, Any]) -> str:
    return f"{body['status']}: model {body['model']}, up {duration(body['uptime'])}"


def _summary(s: dict[str, Any]) -> str:
    if not s["count"]:
        return "no samples"
    return f"p50 {duration(s['p50'])}  p90 {duration(s['p90'])}  p99 {duration(s['p99'])}  (n={s['count']})"


def format_stats(body: dict[str, Any]) -> str:
    req, tp, lat = body["requests"], body["throughput"], body["latency"]
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(req["by_finish_reason"].items()))
    lines = [
        ("model", f"{body['model'] or '(loading)'} (up {duration(body['uptime_s'])})"),
        ("requests", f"{req['running']} running, {req['queued']} queued, {req['finished']} finished"
                     + (f" ({reasons})" if reasons else "")),
        ("throughput", f"prompt {tp['prompt_tokens_per_s']:.1f} tok/s, generation "
                       f"{tp['generation_tokens_per_s']:.1f} tok/s (last {body['window_s']} s)"),
        ("TTFT", _summary(lat["ttft_s"])),
        ("inter-token", _summary(lat["inter_token_s"])),
        ("end to end", _summary(lat["e2e_s"])),
    ]
    if body.get("engine"):
        lines += _engine_lines(body["engine"])
    else:
        lines.append(("engine", "no snapshot yet"))
    width = max(len(k) for k, _ in lines)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in lines)


# Memory-plan fields worth a person's eye (bytes), with their labels.
_PLAN_PARTS = (("budget", "budget"), ("weights", "weights"), ("experts_resident", "resident experts"),
               ("kv_bytes", "KV"), ("workspace", "workspace"))


def _engine_lines(e: dict[str, Any]) -> list[tuple[str, str]]:
    pool, prefix, mem = e["kv_pool"], e["prefix_cache"], e["memory"]
    lines = [
        ("KV pool", f"{pool['pages_in_use']}/{pool['pages_total']} pages in use ({pool['usage']:.1%}), "
                    f"{pool['pages_free']} free, {pool['pages_cached']} cached "
                    f"({pool['pages_evictable']} evictable)"),
        ("prefix cache", f"{prefix['hit_rate']:.1%} of {prefix['query_tokens']} prompt tokens hit "
                         f"({prefix['queries']} lookups)"),
    ]
    if e.get("expert_cache"):
        x = e["expert_cache"]
        lines.append(("expert cache", f"{x['hit_rate']:.1%} hits ({x['hits']} hits, {x['misses']} misses), "
                                      f"{size(x['bytes_copied'])} copied, {x['experts_cpu']} on CPU, "
                                      f"{x['misses_per_token']:.2f} misses/token"))
        if x["hit_rate_by_layer"]:
            lines.append(("  by layer", " ".join(f"{r:.2f}" for r in x["hit_rate_by_layer"])))
    plan = ", ".join(f"{label} {size(mem['plan'][key])}" for key, label in _PLAN_PARTS
                     if isinstance(mem["plan"].get(key), int))
    if mem["plan"].get("num_slots"):
        plan += f", {mem['plan']['num_slots']} expert slots"
    lines.append(("memory", f"plan: {plan or '-'}; device allocated {size(mem['device_allocated_bytes'])}, "
                            f"engine RSS {size(mem['engine_host_rss_bytes'])}"))
    lines.append(("engine", f"{e['requests_running']} running, {e['requests_waiting']} waiting, "
                            f"moe backend {e['moe_backend'] or '-'} (snapshot {duration(e['age_s'])} old)"))
    return lines


def format_engine_stats(stats: dict[str, Any]) -> str:
    """`Engine.stats()` (in-process: `LLM.stats()`) in `ctl stats`'s engine lines."""
    from edgemoe.engine.stats_report import to_engine_stats
    from edgemoe.server.stats_api import engine_view

    lines = _engine_lines(engine_view(to_engine_stats(stats)).model_dump())
    width = max(len(k) for k, _ in lines)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in lines)


def format_requests(body: dict[str, Any]) -> str:
    header = f"{'age':>8}  {'endpoint':<28} {'status':<9} {'prompt':>7} {'cached':>7} {'out':>6} " \
             f"{'TTFT':>9} {'e2e':>9} {'tok/s':>7}  error"
    rows = [header]
    now = time.time()
    for r in body["data"]:
        status = r["finish_reason"] if r["status"] == "finished" else r["status"]
        rate = f"{r['decode_tokens_per_s']:.1f}" if r["decode_tokens_per_s"] else "-"
        rows.append(
            f"{duration(max(0.0, now - r['arrival'])):>8}  {r['endpoint'][:28]:<28} {status:<9} "
            f"{r['prompt_tokens']:>7} {r['cached_tokens']:>7} {r['completion_tokens']:>6} "
            f"{duration(r['ttft_s']):>9} {duration(r['e2e_s']):>9} {rate:>7}  {(r['error'] or '')[:60]}"
        )
    if len(rows) == 1:
        rows.append("(no requests yet)")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
