/* The CPU's share of one MoE layer as a host function: `em_host_layer(mailbox)` has the
 * signature of a CUDA host callback (`void fn(void *)`), so a CUDA graph can hold it as
 * a host node (cudaLaunchHostFunc while capturing) and a decode step keeps the CPU's
 * experts inside one graph replay, with no Python and no host sync. Included by
 * expert.c (uses em_experts and em_job).
 *
 * The mailbox (`em_mailbox`, mirrored by kernels/cpu_host_layer.py's MAILBOX_FIELDS) is
 * one per MoE layer: the layer's expert banks and the kernel's settings, written once by
 * Python, and the addresses of the buffers the device writes before the node runs:
 *   count            int32: the number n of CPU pairs (<= cap);
 *   pairs            int32 [3][cap]: token row, expert id, pair index (t*K + k), in pair order;
 *   weights          fp32 [cap]: each pair's routing weight;
 *   x                [rows][x_stride] bf16 or fp32: the step's token rows.
 * It writes out [cap][H] fp32: row i = weights[i] * expert(x[token i]), the cell of
 * pair i weighted as the host path's CPU cells (em_store: scale * y, rounded once).
 * `status`: 0, or the failure (-1 bad mailbox contents, -2 memory, ...): then rows
 * 0..n-1 of out are NaN, so a failure inside a graph shows in the outputs.
 * `calls`, `busy_ns`: cumulative counts of calls that had pairs and the wall time they
 * took here (the CPU side of the split, read by the statistics; nothing else times a
 * host node inside a graph); `fit_*`: decayed sums for the CPU's cost law (em_host_fit).
 * `act`, `alpha`, `limit`: the layer's GLU (em_glu.h; alpha and limit as fp64 bits);
 * `gate_up_bias`, `down_bias`: bias bank bases [E][2I], [E][H] (0: none) in bf16
 * (`bias_bf16`) or fp32, addressed by expert id as the weight banks are.
 */
#ifndef EM_HOST_H
#define EM_HOST_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* NOTE: every field 64-bit, in this order: Python fills a plain int64 row (MAILBOX_FIELDS). */
typedef struct {
    int64_t pool;                      /* em_create handle */
    int64_t gate_up, down;             /* bank bases: [E][2I][H], [E][H][I] (bf16, int8, e4m3 or int4) */
    int64_t gate_up_stride, down_stride; /* bytes per expert */
    int64_t gate_up_scale, down_scale; /* quantised: scale bank bases (0: none) */
    int64_t gate_up_scale_stride, down_scale_stride; /* bytes per expert */
    int64_t gate_up_zero, down_zero;   /* int4: zero-point bank bases (0: none) */
    int64_t gate_up_zero_stride, down_zero_stride; /* bytes per expert */
    int64_t num_experts, H, I, wfmt, blk, gemm_min_tokens;
    int64_t x, x_bf16, x_stride, x_rows; /* token rows: address, bf16?, elements per row, rows */
    int64_t count, pairs, weights, cap;  /* device-written pair list (see above) */
    int64_t out;                         /* fp32 [cap][H] */
    int64_t scratch;                     /* int32 [3 * cap + 2 * (num_experts + 1)] + em_job [cap] */
    int64_t status;                      /* written here: 0 or the failure */
    int64_t calls, busy_ns;              /* written here: calls with pairs, their wall time */
    /* written here, under the sequence number `fit_seq` (odd while writing): decayed sums of
     * the calls' (jobs j, pairs p, ns t) for a fit t = c + a j + b p (doubles in int64 slots) */
    int64_t fit_seq, fit_n, fit_j, fit_p, fit_t, fit_jj, fit_jp, fit_pp, fit_jt, fit_pt;
    int64_t act, alpha, limit;                       /* EM_ACT_*; swiglu_oai's alpha, limit (fp64 bits) */
    int64_t bias_bf16, gate_up_bias, down_bias;      /* bias banks (0: none), bf16 or fp32 */
    int64_t gate_up_bias_stride, down_bias_stride;   /* bytes per expert */
} em_mailbox;

#define EM_FIT_DECAY 0.995 /* ~200 calls of memory: a few prompt chunks of a 48-layer model */

static inline void em_fit_add(int64_t *slot, double decay, double v) {
    double d;
    memcpy(&d, slot, sizeof d);
    d = d * decay + v;
    memcpy(slot, &d, sizeof d);
}

/* One call's sample into the mailbox's sums; readers retry while fit_seq is odd or moves. */
static void em_host_fit(em_mailbox *m, double j, double p, double t) {
    __atomic_store_n(&m->fit_seq, m->fit_seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    const double k = EM_FIT_DECAY;
    em_fit_add(&m->fit_n, k, 1.0);
    em_fit_add(&m->fit_j, k, j);
    em_fit_add(&m->fit_p, k, p);
    em_fit_add(&m->fit_t, k, t);
    em_fit_add(&m->fit_jj, k, j * j);
    em_fit_add(&m->fit_jp, k, j * p);
    em_fit_add(&m->fit_pp, k, p * p);
    em_fit_add(&m->fit_jt, k, j * t);
    em_fit_add(&m->fit_pt, k, p * t);
    __atomic_store_n(&m->fit_seq, m->fit_seq + 1, __ATOMIC_RELEASE);
}

#define EM_PTR(T, a) ((T)(intptr_t)(a))

static void em_host_fail(em_mailbox *m, int64_t n, int64_t rc) {
    float *out = EM_PTR(float *, m->out);
    for (int64_t i = 0; i < n * m->H; i++) out[i] = NAN;
    m->status = rc;
}

/* Groups the n pairs by expert (stable: each expert's pairs in pair order, as the host
 * path's route_cells) into a job table; returns the number of jobs, or -1 (bad ids). */
static int em_host_jobs(em_mailbox *m, int64_t n, em_job *jobs) {
    const int32_t *tok = EM_PTR(const int32_t *, m->pairs), *exp = tok + m->cap;
    const float *w = EM_PTR(const float *, m->weights);
    int64_t E = m->num_experts;
    int32_t *s_tok = EM_PTR(int32_t *, m->scratch), *s_row = s_tok + m->cap;
    float *s_w = (float *)(s_row + m->cap);
    int32_t *start = (int32_t *)(s_w + m->cap), *fill = start + E + 1;
    memset(start, 0, (size_t)(E + 1) * sizeof(int32_t));
    for (int64_t i = 0; i < n; i++) {
        /* NOTE: the kernel trusts every index; a bad one would read wild memory. */
        if (exp[i] < 0 || exp[i] >= E || tok[i] < 0 || tok[i] >= m->x_rows) return -1;
        start[exp[i] + 1]++;
    }
    for (int64_t e = 0; e < E; e++) start[e + 1] += start[e];
    memcpy(fill, start, (size_t)(E + 1) * sizeof(int32_t));
    for (int64_t i = 0; i < n; i++) {
        int32_t at = fill[exp[i]]++;
        s_tok[at] = tok[i];
        s_row[at] = (int32_t)i;
        s_w[at] = w[i];
    }
    int njobs = 0;
    for (int64_t e = 0; e < E; e++) {
        if (start[e + 1] == start[e]) continue;
        em_job *jb = &jobs[njobs++];
        jb->gate_up = m->gate_up + e * m->gate_up_stride;
        jb->down = m->down + e * m->down_stride;
        jb->tokens = (int64_t)(intptr_t)(s_tok + start[e]);
        jb->out_rows = (int64_t)(intptr_t)(s_row + start[e]);
        jb->scale = (int64_t)(intptr_t)(s_w + start[e]);
        jb->n = start[e + 1] - start[e];
        jb->gate_up_scale = m->gate_up_scale ? m->gate_up_scale + e * m->gate_up_scale_stride : 0;
        jb->down_scale = m->down_scale ? m->down_scale + e * m->down_scale_stride : 0;
        jb->gate_up_zero = m->gate_up_zero ? m->gate_up_zero + e * m->gate_up_zero_stride : 0;
        jb->down_zero = m->down_zero ? m->down_zero + e * m->down_zero_stride : 0;
        jb->gate_up_bias = m->gate_up_bias ? m->gate_up_bias + e * m->gate_up_bias_stride : 0;
        jb->down_bias = m->down_bias ? m->down_bias + e * m->down_bias_stride : 0;
    }
    return njobs;
}

/* The host node: run the mailbox's CPU pairs. Never fails loudly (no caller to tell, in
 * a graph): `status` and NaN rows say what went wrong. */
void em_host_layer(void *mailbox) {
    em_mailbox *m = (em_mailbox *)mailbox;
    int64_t n = *EM_PTR(const volatile int32_t *, m->count);
    if (n < 0 || n > m->cap) {
        m->status = -1;
        return;
    }
    m->status = 0;
    if (n == 0) return;
    long start = em_now_ns();
    /* Scratch after the int32 arrays, rounded up to the job table's alignment. */
    int64_t ints = 3 * m->cap + 2 * (m->num_experts + 1);
    em_job *jobs = EM_PTR(em_job *, m->scratch + ((ints * 4 + 63) / 64) * 64);
    int njobs = em_host_jobs(m, n, jobs);
    if (njobs < 0) {
        em_host_fail(m, n, -1);
        return;
    }
    double alpha, limit;
    memcpy(&alpha, &m->alpha, sizeof alpha);
    memcpy(&limit, &m->limit, sizeof limit);
    const em_glu_spec glu = {(int)m->act, (float)alpha, (float)limit, (int)m->bias_bf16};
    /* detached: x, the banks and out stay put between calls (the mailbox's contract) */
    int rc = em_experts_in(EM_PTR(void *, m->pool), EM_PTR(const void *, m->x), (int)m->x_bf16, m->x_stride,
                           EM_PTR(float *, m->out), m->H, (int)m->H, (int)m->I, jobs, njobs, (int)m->gemm_min_tokens,
                           (int)m->wfmt, (int)m->blk, &glu, 1);
    if (rc != 0) em_host_fail(m, n, rc);
    long took = em_now_ns() - start;
    m->calls += 1;
    m->busy_ns += took;
    if (rc == 0) em_host_fit(m, (double)njobs, (double)n, (double)took);
}

/* The bell: a host thread that runs a layer's mailbox as soon as the device asks, in
 * place of a host node (whose round trip through the driver's callback thread costs tens
 * of µs a layer). The device clears `done`, then writes `ring` = row + 1 after the mailbox
 * writes (a release store from the launch that wrote them, or a stream memory operation
 * after it) and later waits for `done` == row + 1 (an acquire spin in the combine's
 * launch, or on the stream); the thread resets ring, runs em_host_layer on mailbox `row`
 * of the table, then publishes done. Each layer of a step has its own value, so a graph
 * replays the same constants every step. The thread spins while rings come
 * (a decode step's layers are a few hundred µs apart), then polls every 20 µs, and
 * after a second idle every 500 µs. `quiet` (em_bell_quiet: the host expects no ring, e.g.
 * a live quota at level 0 whose graphs run without the share) goes to the 500 µs polls
 * straight after the spin: 50,000 wake-ups a second for nothing woke a core beside the
 * engine's thread for a second after each burst. A ring that comes anyway is answered
 * within one poll, and spinning resumes after it. */
typedef struct {
    volatile int32_t *ring, *done;
    int64_t table, row_bytes, rows;
    atomic_int stop, quiet;
    pthread_t thread;
} em_bell;

static void *em_bell_main(void *arg) {
    em_bell *b = (em_bell *)arg;
    long idle_since = em_now_ns();
    em_name_thread("em-bell");
    for (;;) {
        int32_t r = __atomic_load_n(b->ring, __ATOMIC_ACQUIRE);
        if (r == 0) {
            if (atomic_load(&b->stop)) break;
            long idle = em_now_ns() - idle_since;
            if (idle < 2000000L) {
                em_relax();
            } else {
                int slow = idle >= 1000000000L || atomic_load_explicit(&b->quiet, memory_order_relaxed);
                struct timespec ts = {0, slow ? 500000L : 20000L};
                nanosleep(&ts, NULL);
            }
            continue;
        }
        __atomic_store_n(b->ring, 0, __ATOMIC_RELAXED);
        if (r > 0 && r <= b->rows) em_host_layer((void *)(intptr_t)(b->table + (int64_t)(r - 1) * b->row_bytes));
        __atomic_store_n(b->done, r, __ATOMIC_RELEASE);
        idle_since = em_now_ns();
    }
    return NULL;
}

/* ring / done: host addresses of two int32 words (page-locked, mapped for the device; keep
 * them on separate cache lines); table: the mailbox rows, row_bytes apart. NULL: failed. */
void *em_bell_start(int64_t ring, int64_t done, int64_t table, int64_t row_bytes, int64_t rows) {
    em_bell *b = (em_bell *)calloc(1, sizeof(em_bell));
    if (!b) return NULL;
    b->ring = EM_PTR(volatile int32_t *, ring);
    b->done = EM_PTR(volatile int32_t *, done);
    b->table = table;
    b->row_bytes = row_bytes;
    b->rows = rows;
    atomic_init(&b->stop, 0);
    atomic_init(&b->quiet, 0);
    if (pthread_create(&b->thread, NULL, em_bell_main, b) != 0) {
        free(b);
        return NULL;
    }
    return b;
}

void em_bell_quiet(void *bell, int32_t quiet) {
    if (bell) atomic_store(&((em_bell *)bell)->quiet, quiet != 0);
}

void em_bell_stop(void *bell) {
    em_bell *b = (em_bell *)bell;
    if (!b) return;
    atomic_store(&b->stop, 1);
    pthread_join(b->thread, NULL);
    free(b);
}

#endif
