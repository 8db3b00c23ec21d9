/* The call's schedule: each phase's lanes and claims, a task's dispatch to its path, the
 * phases run by every thread in the call (and a detached call's waits, em_detach.h), and
 * the layout of the call's state in its slot (em_plan). Included by expert.c after the
 * task functions (uses em_call, em_job, em_jobstate and every path's tasks).
 */
#ifndef EM_SCHED_H
#define EM_SCHED_H

static int em_find_job(const em_call *c, int ph, int64_t task) {
    int lo = 0, hi = c->njobs - 1; /* last job whose start <= task */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (c->st[mid].start[ph] <= task)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Cuts each phase's tasks into `nlanes` contiguous lanes. */
static void em_plan_lanes(em_call *c) {
    c->nlanes = c->pool->nthreads < EM_MAX_LANES ? c->pool->nthreads : EM_MAX_LANES;
    for (int ph = 0; ph < 3; ph++)
        for (int k = 0; k < c->nlanes; k++) {
            atomic_init(&c->lanes[ph][k].next, c->ntasks[ph] * k / c->nlanes);
            c->lanes[ph][k].end = c->ntasks[ph] * (k + 1) / c->nlanes;
        }
}

static int64_t em_claim_in(em_lane *l) {
    if (atomic_load_explicit(&l->next, memory_order_relaxed) >= l->end) return -1;
    int64_t task = atomic_fetch_add(&l->next, 1);
    return task < l->end ? task : -1;
}

/* The next task of phase `ph` for a thread holding lane *lane (-1: none yet; nlanes or
 * more: every lane was taken), or -1 when every task of the phase is claimed. */
static int64_t em_claim(em_call *c, int ph, int *lane) {
    if (!EM_LANES) {
        int64_t task = atomic_fetch_add(&c->next[ph], 1);
        return task < c->ntasks[ph] ? task : -1;
    }
    while (*lane < c->nlanes) { /* its own lane, then the next untaken one */
        if (*lane >= 0) {
            int64_t task = em_claim_in(&c->lanes[ph][*lane]);
            if (task >= 0) return task;
        }
        *lane = atomic_fetch_add(&c->lanes_taken[ph], 1);
    }
    for (int k = 0; k < c->nlanes; k++) { /* every lane is taken: help with what is left */
        int64_t task = em_claim_in(&c->lanes[ph][k]);
        if (task >= 0) return task;
    }
    return -1;
}

/* Tasks of job j in phase ph. */
static int64_t em_job_tasks(const em_call *c, int ph, int j) {
    int64_t end = j + 1 < c->njobs ? c->st[j + 1].start[ph] : c->ntasks[ph];
    return end - c->st[j].start[ph];
}

/* With `join`: a down task of job j waits until j's gate_up tasks are done (they are all
 * claimed: a thread leaves phase 1 only then, so the wait ends). */
static void em_join_job(em_call *c, int j) {
#if EM_PHASE_JOIN
    int64_t want = em_job_tasks(c, 1, j);
    for (long spins = 0; atomic_load(&c->up_done[j]) < want; spins++) em_backoff(spins);
#else
    (void)c;
    (void)j;
#endif
}

/* Runs task `task` of phase ph; returns its job. */
static int em_run_task(em_call *c, int ph, int64_t task) {
    int j = em_find_job(c, ph, task);
    const em_job *jb = &c->jobs[j];
    const em_jobstate *s = &c->st[j];
    int64_t q = task - s->start[ph];
    if (ph == 2 && c->join) em_join_job(c, j);
    if (ph == 0) {
        em_pack(c, jb, s, (int)q);
#if EM_HAS_GEMM
    } else if (s->gemm && c->wfmt != EM_W_BF16) {
        if (ph == 1)
            em_gate_up_gemm_q(c, jb, s, q);
        else
            em_down_gemm_q(c, jb, s, q);
    } else if (s->gemm) {
        if (ph == 1)
            em_gate_up_gemm(c, jb, s, q);
        else
            em_down_gemm(c, jb, s, q);
#endif
    } else if (em_nibbles(c->wfmt)) {
        if (ph == 1)
            em_gate_up_gemv_i4(c, jb, s, q);
        else
            em_down_gemv_i4(c, jb, s, q);
    } else if (c->wfmt != EM_W_BF16) {
        if (ph == 1)
            em_gate_up_gemv_q(c, jb, s, q);
        else
            em_down_gemv_q(c, jb, s, q);
    } else if (ph == 1) {
        em_gate_up_gemv(c, jb, s, q);
    } else {
        em_down_gemv(c, jb, s, q);
    }
#if EM_PHASE_JOIN
    if (ph == 1 && c->join) atomic_fetch_add(&c->up_done[j], 1); /* seq_cst: publishes its h rows */
#endif
    return j;
}

#include "em_stall.h" /* EM_TEST_STALL builds: workers held at chosen points (tests only) */

/* Claims and runs phase ph's tasks until none is left to claim; returns how many it ran. */
static int64_t em_run_phase(em_call *c, int ph) {
    int lane = -1;
    for (int64_t ran = 0;; ran++) {
        int64_t task = em_claim(c, ph, &lane);
        if (task < 0) return ran;
        EM_STALL_POINT(ph, 0);
        int j = em_run_task(c, ph, task);
        EM_STALL_POINT(ph, 1);
        if (c->detached)
            em_detach_done(c, ph, task, j);
        else
            atomic_fetch_add(&c->done[ph], 1);
    }
}

/* Waits for phase ph's tasks, running a late thread's task again after the grace period.
 * `ran`: tasks this thread ran since `t0` (its own measure of a task's time). */
static void em_detach_wait(em_call *c, int ph, int64_t ran, long t0) {
    long since = em_now_ns();
    if (ran) atomic_store_explicit(&c->task_ns[ph], (since - t0) / ran, memory_order_relaxed);
    int64_t from = (int64_t)(((uintptr_t)&since >> 6) % 4093);
    for (long spins = 0; atomic_load(&c->done[ph]) < c->ntasks[ph]; spins++) {
        em_backoff(spins);
        if ((spins & 63) != 63) continue;
        long mean = atomic_load_explicit(&c->task_ns[ph], memory_order_relaxed);
        long grace = EM_RESCUE_TASKS * mean > EM_RESCUE_NS ? EM_RESCUE_TASKS * mean : EM_RESCUE_NS, now = em_now_ns();
        if (now - since < grace || !EM_MAY_RESCUE()) continue;
        int64_t task = em_straggler(c, ph, from, (uint32_t)((now - c->began) / 1000), (uint32_t)(grace / 1000));
        if (task < 0) continue;
        EM_STALL_POINT(ph, 2);
        em_detach_done(c, ph, task, em_run_task(c, ph, task));
        atomic_fetch_add_explicit(&c->pool->rescued, 1, memory_order_relaxed);
        since = em_now_ns();
        spins = 0;
    }
}

/* Test builds (em_stall.h's em_test_repack): after phase ph's wait, past gate_up (ph 1), the
 * caller runs every pack task again while the workers wait for it (`repacked`). */
static void em_repack_point(em_call *c, int ph) {
    if (ph != 1 || !c->repack) return;
    if (!em_in_worker) {
        for (int64_t task = 0; task < c->ntasks[0]; task++) em_run_task(c, 0, task);
        atomic_store(&c->repacked, 1);
        return;
    }
    while (!atomic_load(&c->repacked)) em_relax();
}

/* Every thread in the call: claim tasks of a phase; when none are left, wait until
 * all of them are done (phase 1 reads what phase 0 wrote, and so on). */
static void em_call_task(void *ctx) {
    em_call *c = (em_call *)ctx;
#if defined(EM_ISA_AMX)
    if (c->any_gemm) em_amx_config();
#endif
    EM_PT_ENTER(me);
    for (int ph = 0; ph < 3; ph++) {
        long t0 = c->detached ? em_now_ns() : 0;
        int64_t ran = em_run_phase(c, ph);
        EM_PT_MARK(me, 1 + 2 * ph);
        if (c->detached)
            em_detach_wait(c, ph, ran, t0);
        else if (ph != 1 || !c->join)
            em_wait_count(&c->done[ph], c->ntasks[ph]); /* join: down waits by expert */
        if (EM_TEST_STALL) em_repack_point(c, ph);
        EM_PT_MARK(me, 2 + 2 * ph);
    }
    EM_PT_SUMS(me);
#if defined(EM_ISA_AMX)
    if (c->any_gemm) em_amx_release();
#endif
}

/* Lays out job states and buffers (and a detached call's state) in the slot's
 * workspace; returns 0 or -2 (memory). */
static int em_plan(em_call *c, em_slot *slot, int gemm_min_tokens) {
    size_t size = (size_t)em_round_up((int64_t)c->njobs * (int64_t)sizeof(em_jobstate), 64);
    for (int pass = 0; pass < 2; pass++) {
        uint8_t *base = pass ? (uint8_t *)em_slot_workspace(slot, size) : NULL;
        if (pass && !base) return -2;
        c->st = (em_jobstate *)base;
        size_t off = (size_t)em_round_up((int64_t)c->njobs * (int64_t)sizeof(em_jobstate), 64);
        int64_t tasks[3] = {0, 0, 0}, pairs = 0;
        for (int j = 0; j < c->njobs; j++) {
            em_jobstate s = {0};
            s.n = (int)c->jobs[j].n;
            s.pair0 = pairs;
            pairs += s.n;
            s.gemm = EM_HAS_GEMM && s.n >= gemm_min_tokens;
            s.np = (int)em_round_up(s.n, 16);
            size_t a = s.gemm ? (size_t)(c->Px * s.np * 4) : (size_t)(s.n * c->Hs * 4);
            size_t b = s.gemm ? (size_t)(c->Ph * s.np * 4) : (size_t)(s.n * c->Is * 4);
            if (pass) {
                s.xs = (float *)(base + off);
                s.xp = (uint32_t *)(base + off);
                s.hs = (float *)(base + off + em_round_up((int64_t)a, 64));
                s.hp = (uint32_t *)(base + off + em_round_up((int64_t)a, 64));
            }
            off += (size_t)em_round_up((int64_t)a, 64) + (size_t)em_round_up((int64_t)b, 64);
            const int q8 = c->wfmt == EM_W_INT8 || c->wfmt == EM_W_FP8;
            int64_t p1 = s.gemm ? EM_P1_GEMM : q8 ? EM_P1_GEMV_Q : EM_P1_GEMV;
            int64_t p2 = s.gemm ? EM_P2_GEMM : q8 ? EM_P2_GEMV_Q : EM_P2_GEMV;
            int64_t counts[3] = {em_pack_tasks(c, &s), (c->I + p1 - 1) / p1, (c->H + p2 - 1) / p2};
            s.p2 = p2;
            for (int ph = 0; ph < 3; ph++) {
                s.start[ph] = tasks[ph];
                tasks[ph] += s.n > 0 ? counts[ph] : 0;
            }
            c->any_gemm |= s.gemm;
            if (pass) c->st[j] = s;
        }
        for (int ph = 0; ph < 3; ph++) c->ntasks[ph] = tasks[ph];
        if (c->detached && pass) em_detach_layout(c, base + off, pairs);
        size = off + (c->detached ? em_detach_bytes(c, pairs) : 0);
    }
    return 0;
}

#endif
