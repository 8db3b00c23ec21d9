"""The host counters a decode phase records (bench/host_counters.py)."""

from __future__ import annotations

import sys
import threading

import pytest

from edgemoe.bench.host_counters import counters_delta, host_counters


def test_delta_and_cpu_shares() -> None:
    before = {"cpu_user_ticks": 100, "cpu_idle_ticks": 50, "cpu_steal_ticks": 0, "ctx_switches_involuntary": 3}
    after = {"cpu_user_ticks": 160, "cpu_idle_ticks": 80, "cpu_steal_ticks": 10, "ctx_switches_involuntary": 7,
             "vm_pgscan_kswapd": 5}  # a counter only one snapshot has is left out
    d = counters_delta(before, after)
    assert d["cpu_user_ticks"] == 60 and d["ctx_switches_involuntary"] == 4 and "vm_pgscan_kswapd" not in d
    assert d["cpu_user_share"] == 0.6 and d["cpu_idle_share"] == 0.3 and d["cpu_steal_share"] == 0.1
    assert counters_delta({}, after) == {}  # no /proc: nothing, not an error


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc counters")
def test_linux_counters_count_this_processs_threads() -> None:
    before = host_counters()
    assert {"cpu_user_ticks", "cpu_steal_ticks", "ctx_switches_voluntary"} <= before.keys()
    waits = [threading.Event() for _ in range(4)]
    threads = [threading.Thread(target=w.wait, args=(0.01,)) for w in waits]  # each sleeps: voluntary switches
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = host_counters()
    d = counters_delta(before, after)
    assert all(v >= 0 for k, v in d.items() if k.endswith("_ticks"))
    assert abs(sum(v for k, v in d.items() if k.endswith("_share")) - 1.0) < 1e-9 or not any(k.endswith("_share") for k in d)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc counters")
def test_a_spinning_thread_is_named_busy() -> None:
    import time

    from edgemoe.bench.host_counters import busy_threads, thread_ticks

    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    t = threading.Thread(target=spin)
    before, t0 = thread_ticks(), time.perf_counter()
    t.start()
    time.sleep(0.6)
    after, seconds = thread_ticks(), time.perf_counter() - t0
    stop.set()
    t.join()
    busy = busy_threads(before, after, seconds)
    spinner = [share for name, share in busy if name.startswith(f"{t.native_id} ")]
    # the GIL shares one core between the spinner and this thread's sleep (which holds none):
    # the spinner has most of a core, whatever the machine's load (>= 0.2 leaves room)
    assert spinner and spinner[0] >= 0.2, busy


def test_a_disturbed_phase_is_named_and_a_quiet_one_is_not() -> None:
    from edgemoe.bench.host_counters import disturbance

    # The GPU machine's fresh-VM run (8.4% stolen, 10,615 switches in 240 steps) and the
    # same build a minute later (0.07%, 110).
    slow = disturbance({"cpu_steal_share": 0.0837, "cpu_steal_ticks": 1020, "cpu_user_ticks": 11160,
                        "ctx_switches_involuntary": 10615}, 240)
    assert slow is not None and "8.4% of the CPU time stolen" in slow and "44.2 involuntary" in slow
    assert disturbance({"cpu_steal_share": 0.0007, "ctx_switches_involuntary": 110}, 240) is None
    assert disturbance({"cpu_steal_share": 0.0, "ctx_switches_involuntary": 2400}, 240) is not None  # switches alone
    assert disturbance({}, 0) is None  # no counters (not Linux): no note
    # Without steps (a phase whose threads outnumber the cores by design): steal alone.
    assert disturbance({"cpu_steal_share": 0.0, "ctx_switches_involuntary": 2400}) is None
    steal = disturbance({"cpu_steal_share": 0.02, "cpu_steal_ticks": 20, "cpu_idle_ticks": 980,
                         "ctx_switches_involuntary": 2400})
    assert steal is not None and "2.0% of the CPU time stolen" in steal and "switches" not in steal
    # A phase of a few ticks: its share is the accounting's granularity, not judged.
    assert disturbance({"cpu_steal_share": 0.25, "cpu_steal_ticks": 1, "cpu_user_ticks": 3}) is None
