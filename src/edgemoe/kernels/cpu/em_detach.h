/* Detached calls: a call whose return does not wait on a descheduled worker.
 *
 * A worker that loses its core while it holds a task (the hypervisor's steal, another
 * process on the core) held the whole call: the phase waited for the task, and the call
 * for the worker to leave it. In a detached call (the CPU share's host function,
 * em_host.h, whose inputs stay put between calls):
 *
 *  - rescue: a thread with nothing left to claim in a phase runs a claimed task that is
 *    not done once a grace period has passed (EM_RESCUE_NS, or EM_RESCUE_TASKS times a
 *    task's time in this call, whichever is longer), and again after as long if that run
 *    has not finished either (its thread may lose its core too); the first to finish a task
 *    counts it (`won`). A task's results are deterministic and its stores plain, so a second
 *    run writes the same bits where the first did, and no word is written by two phases (a
 *    late pack lands after gate_up: em_pack_token_pairs leaves gate_up's pairs alone);
 *  - private state: everything a late worker may still write lives in the call's slot
 *    (em_pool.h): the job table and its token / row / scale arrays are copied there, and the
 *    down rows are written to the slot's `ys` rows, not to the caller's output. What it may
 *    still read beyond the slot (the mailbox's x, the banks) is freed only after
 *    em_pool_quiesce;
 *  - commit: the first finisher of a down task copies its rows of `ys` to the output
 *    before counting the task done, so the call ends after every output write, and a
 *    late worker, whose task someone else committed, never writes the output;
 *  - the call returns when its tasks are done (em_pool_run, detached), and the next call
 *    takes another slot while a late worker is still inside this one.
 *
 * A worker delayed inside a commit (a few hundred bytes' copy) still holds the call: the
 * copy is the one window no other thread can take over.
 * The waits that rescue are the schedule's (em_sched.h: em_detach_wait). Included by expert.c
 * before the schedule (uses em_call, em_job, em_jobstate).
 */
#ifndef EM_DETACH_H
#define EM_DETACH_H

#ifndef EM_DETACH
#define EM_DETACH 1 /* 0: the host function's calls wait for every worker (the A/B's other arm) */
#endif
#ifndef EM_RESCUE_NS
#define EM_RESCUE_NS 30000 /* the shortest wait before running another thread's task again */
#endif
#ifndef EM_RESCUE_TASKS
#define EM_RESCUE_TASKS 4 /* ... or this many of a task's times in this call, if longer */
#endif

/* Bytes of the detached state after the job states: per task its first finisher's flag and
 * its latest rescue's start, the copied job table and its arrays, and the ys rows (pairs x H
 * fp32). */
static size_t em_detach_bytes(const em_call *c, int64_t pairs) {
    int64_t tasks = c->ntasks[0] + c->ntasks[1] + c->ntasks[2];
    size_t b = (size_t)em_round_up(tasks, 64) + (size_t)em_round_up(4 * tasks, 64);
    b += (size_t)em_round_up((int64_t)c->njobs * (int64_t)sizeof(em_job), 64);
    b += (size_t)em_round_up(4 * 4 * pairs, 64); /* tokens, ys rows, output rows, scales */
    return b + (size_t)(pairs * c->H * 4);
}

/* Lays the detached state out at `base` (the slot's workspace past the job states),
 * copies the job table there and points the call's stores at `ys`. */
static void em_detach_layout(em_call *c, uint8_t *base, int64_t pairs) {
    int64_t tasks = c->ntasks[0] + c->ntasks[1] + c->ntasks[2], flags = em_round_up(tasks, 64);
    memset(base, 0, (size_t)(flags + 4 * tasks));
    for (int ph = 0, at = 0; ph < 3; at += (int)c->ntasks[ph], ph++) {
        c->won[ph] = (atomic_uchar *)(base + at);
        c->rescued_at[ph] = (atomic_uint *)(base + flags) + at;
    }
    base += flags + em_round_up(4 * tasks, 64);
    em_job *jobs = (em_job *)base;
    base += em_round_up((int64_t)c->njobs * (int64_t)sizeof(em_job), 64);
    int32_t *tok = (int32_t *)base, *yrow = tok + pairs, *orow = yrow + pairs;
    float *scale = (float *)(orow + pairs);
    base += em_round_up(4 * 4 * pairs, 64);
    for (int j = 0; j < c->njobs; j++) {
        const em_job *from = &c->jobs[j];
        int64_t p0 = c->st[j].pair0, n = from->n;
        jobs[j] = *from;
        for (int64_t t = 0; t < n; t++) {
            tok[p0 + t] = (int32_t)em_token(from, (int)t);
            yrow[p0 + t] = (int32_t)(p0 + t);
            orow[p0 + t] = from->out_rows ? ((const int32_t *)(intptr_t)from->out_rows)[t] : (int32_t)t;
            scale[p0 + t] = em_scale(from, (int)t);
        }
        jobs[j].tokens = (int64_t)(intptr_t)(tok + p0);
        jobs[j].out_rows = (int64_t)(intptr_t)(yrow + p0);
        jobs[j].scale = (int64_t)(intptr_t)(scale + p0);
    }
    c->jobs = jobs;
    c->final_rows = orow;
    c->final_out = c->out;
    c->final_stride = c->out_stride;
    c->out = (float *)base;
    c->out_stride = c->H;
}

/* Down task `task` (of job j)'s rows of ys, copied to the output rows of the job's tokens. */
static void em_commit_rows(const em_call *c, int j, int64_t task) {
    const em_jobstate *s = &c->st[j];
    int64_t r0 = (task - s->start[2]) * s->p2, r1 = r0 + s->p2 < c->H ? r0 + s->p2 : c->H;
    for (int t = 0; t < s->n; t++) {
        int64_t p = s->pair0 + t;
        memcpy(c->final_out + c->final_rows[p] * c->final_stride + r0, c->out + p * c->out_stride + r0,
               (size_t)(r1 - r0) * sizeof(float));
    }
}

/* A finished task (of job j): counted by its first finisher only (a down task committed first). */
static void em_detach_done(em_call *c, int ph, int64_t task, int j) {
    if (atomic_exchange(&c->won[ph][task], 1)) return;
    if (ph == 2) em_commit_rows(c, j, task);
    atomic_fetch_add(&c->done[ph], 1); /* seq_cst: publishes the task's writes */
}

/* A task of phase ph claimed but not done that no thread began running again within
 * `grace_us` (a rescuer may lose its core too: then another takes it over), from a place
 * that differs by thread (several rescuers spread), or -1. `now_us`: since the call began. */
static int64_t em_straggler(em_call *c, int ph, int64_t from, uint32_t now_us, uint32_t grace_us) {
    int64_t n = c->ntasks[ph];
    for (int64_t i = 0; i < n; i++) {
        int64_t task = (from + i) % n;
        if (atomic_load_explicit(&c->won[ph][task], memory_order_relaxed)) continue;
        atomic_uint *at = &c->rescued_at[ph][task];
        uint32_t began = atomic_load_explicit(at, memory_order_relaxed); /* 0: never; else 1 + µs */
        if (began && (int64_t)now_us + 1 - (int64_t)began < (int64_t)grace_us) continue;
        if (atomic_compare_exchange_strong(at, &began, now_us + 1)) return task;
    }
    return -1;
}

#endif
