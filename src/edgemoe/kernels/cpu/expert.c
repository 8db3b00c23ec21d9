/* CPU routed experts: y = down @ (silu(gate @ x) * (up @ x)) for several experts of one
 * layer in one call, weights bf16, int8, fp8 e4m3, int4 or mxfp4 (gate_up [2I, H], gate
 * rows first; down [H, I]; quantised ones with their scales, em_quant.h / em_int4.h),
 * activations fp32 or bf16, accumulation fp32. Or gpt-oss's experts: per-expert biases
 * and the clamped SwiGLU, y = down @ glu(gate @ x + b_g, up @ x + b_u) + b_d (em_glu.h).
 * Built by edgemoe/kernels/cpu_build.py once per ISA (-DEM_ISA_AMX | AVX512 | AVX2 |
 * nothing = portable C) and loaded with ctypes: plain pointers, no Python or torch ABI.
 *
 * A call has three phases, each a list of tasks claimed from an atomic counter by the
 * threads in the call; a phase starts when the previous one's tasks are all done:
 *   0. pack each job's token rows (gathered from x) into the layout its path reads;
 *   1. gate_up rows of all jobs → h = silu(gate) * up (or the call's GLU of the biased rows);
 *   2. down rows of all jobs → out[out_rows[t]] = scale[t] * (y + b_d).
 * Splitting output rows of all experts over all threads lets every core stream
 * weights at once. A phase's tasks are cut into one contiguous lane per pool thread
 * (EM_LANES): a thread takes a lane as it arrives and claims the lane's tasks in order,
 * so it reads one run of rows front to back (what the hardware prefetcher streams
 * best) instead of every nth task; a thread whose lane is done takes an untaken lane,
 * then claims from the others', so a late or descheduled thread delays nobody.
 * Jobs with n >= gemm_min_tokens take the blocked path (AMX tiles or AVX-512 BF16,
 * activations rounded to bf16); others the fp32 GEMV path.
 */
#include <math.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "em_gemm.h"
#include "em_gemv.h"
#include "em_pool.h"
#include "em_ptimes.h" /* EM_PHASE_TIMES builds: each thread's phase marks */
#include "em_quant.h"
#include "em_read.h" /* em_read: the memory bandwidth probe of `edgemoe bench bw` */

#define EM_ABI_VERSION 9

#if defined(EM_ISA_AMX) && defined(EM_AMX_EMULATE)
#define EM_ISA_NAME "amx-emu"
#elif defined(EM_ISA_AMX)
#define EM_ISA_NAME "amx"
#elif defined(EM_ISA_AVX512)
#define EM_ISA_NAME "avx512"
#elif defined(EM_ISA_AVX2)
#define EM_ISA_NAME "avx2"
#else
#define EM_ISA_NAME "scalar"
#endif

/* Rows per task (phase 1 counts gate/up row pairs, phase 2 rows of down). */
/* Small GEMV tasks: one expert at batch 1 must still split evenly over 16+ threads. */
#ifndef EM_P1_GEMV
#define EM_P1_GEMV 8 /* a tuning macro: the phase tail is one task's time (~9 µs at 8) */
#endif
#ifndef EM_P2_GEMV
#define EM_P2_GEMV 16
#endif
/* int8 / fp8 GEMV tasks: twice the rows, a bf16 task's bytes. NOTE: a task's first row
 * group starts cold (no group before it prefetched it: the thread's previous task was
 * elsewhere), and at a byte a weight that cost is paid on half the bytes. Measured, 8
 * experts at batch 1 on 2 threads (int8 GB/s): 15.2 → 17.0; 4x the rows, 18.5, but too
 * few tasks to split one expert evenly over 16 threads. On the GPU machine's 16 threads
 * (2026-12-02, scripts/gpu_cpu_ab.py, builds interleaved) 4x was int8 x1.06 / fp8 x1.02
 * for 8 experts but x0.94 / x0.91 for one; and a thread claiming its next task ahead to
 * warm its first group (into L1 or L2) moved nothing beyond ±3%: not kept. */
#ifndef EM_QTASK_MUL
#define EM_QTASK_MUL 2 /* a tuning macro (kernels/cpu_build.py's EDGEMOE_CPU_DEFINES) */
#endif
#define EM_P1_GEMV_Q (EM_QTASK_MUL * EM_P1_GEMV)
#define EM_P2_GEMV_Q (EM_QTASK_MUL * EM_P2_GEMV)
#if defined(EM_ISA_AMX)
#define EM_P1_GEMM 16
#define EM_P2_GEMM 32
#else
#define EM_P1_GEMM 12
#define EM_P2_GEMM 24
#endif

/* One expert's work; every field 64-bit so Python fills a plain int64 table. */
typedef struct {
    int64_t gate_up;  /* address of [2I, H]: bf16, int8 or e4m3; int4: uint8 [2I, ceil(H/2)];
                         mxfp4: uint8 [2I, 16 ceil(H/32)] (whole blocks) */
    int64_t down;     /* address of [H, I] */
    int64_t tokens;   /* address of int32 [n]: rows of x */
    int64_t out_rows; /* address of int32 [n]: rows of out (0: 0..n-1) */
    int64_t scale;    /* address of fp32 [n] (0: 1.0) */
    int64_t n;
    int64_t gate_up_scale; /* int8: fp32 [2I]; fp8: fp32 [2 * ceil(I/blk), ceil(H/blk)] (gate's blocks, then up's);
                              int4: fp16 [2I, ceil(H/blk)]; mxfp4: e8m0 uint8 [2I, ceil(H/32)] */
    int64_t down_scale;    /* int8: fp32 [H]; fp8: fp32 [ceil(H/blk), ceil(I/blk)]; int4: fp16 [H, ceil(I/blk)];
                              mxfp4: e8m0 uint8 [H, ceil(I/32)] */
    int64_t gate_up_zero;  /* int4: uint8 [2I, ceil(H/blk)] zero points; else unused */
    int64_t down_zero;     /* int4: uint8 [H, ceil(I/blk)] */
    int64_t gate_up_bias;  /* this expert's bias [2I] (gate's, then up's), bf16 or fp32 (the call's
                              bias_bf16); 0: none */
    int64_t down_bias;     /* its bias [H]; 0: none */
} em_job;

/* A call's GLU and its jobs' bias dtype (em_glu.h). */
typedef struct {
    int act;            /* EM_ACT_SILU or EM_ACT_SWIGLU_OAI */
    float alpha, limit; /* swiglu_oai's: h = (clamp(u, ±limit) + 1) · g · sigmoid(alpha · g), g = min(g, limit) */
    int bias_bf16;      /* the jobs' biases: bf16 (1) or fp32 (0) */
} em_glu_spec;

typedef struct {
    int gemm, n, np;
    float *xs, *hs;     /* GEMV: [n][Hs], [n][Is] split layout */
    uint32_t *xp, *hp;  /* GEMM: [Px][np], [Ph][np] pair layout */
    int64_t start[4];   /* first task of this job in phase 0..2 ([3] unused) */
    int64_t pair0, p2;  /* its first pair of the call (detached calls' ys rows); rows a down task */
} em_jobstate;

#ifndef EM_LANES
#define EM_LANES 1 /* 0: every thread claims the phase's next task (one shared counter) */
#endif
#define EM_MAX_LANES 64
/* 1: in a call of several experts, a down task waits for its own expert's gate_up tasks
 * instead of the whole phase's: threads whose lanes are done start the ready experts' down
 * rows while the phase's last tasks finish (its tail is one task's time, ~10 µs a call at
 * batch 1 on the GPU machine: scripts/cpu_phase_times.py). A tuning macro for an A/B. */
#ifndef EM_PHASE_JOIN
#define EM_PHASE_JOIN 0
#endif
#define EM_JOIN_MAX_JOBS 256 /* calls of more experts keep the phase's barrier */

/* A contiguous run of a phase's tasks: `next` is claimed up to `end` (own cache line:
 * the owner claims from it every task). */
typedef struct {
    atomic_long next;
    int64_t end;
    char pad[64 - sizeof(atomic_long) - sizeof(int64_t)];
} em_lane;

typedef struct {
    em_pool *pool;
    const em_job *jobs;
    em_jobstate *st;
    int njobs, any_gemm;
    const uint8_t *x;
    int x_bf16;
    int64_t x_stride; /* elements */
    float *out;
    int64_t out_stride;
    int H, I;
    int wfmt, blk; /* EM_W_BF16 / INT8 / FP8 / INT4; fp8 scale block, int4 group */
    em_glu_spec glu; /* the jobs' GLU and bias dtype */
    int64_t Hs, Is, Px, Ph;
    int64_t ntasks[3];
    atomic_long next[3]; /* next task to claim, per phase (EM_LANES 0) */
    int nlanes;
    atomic_int lanes_taken[3]; /* lanes handed to arriving threads, per phase */
    em_lane lanes[3][EM_MAX_LANES];
    atomic_long done[3]; /* tasks finished, per phase */
    atomic_int failed;   /* a task could not allocate its scratch: the call returns -2 */
    int join;            /* EM_PHASE_JOIN in this call: down waits by expert (`up_done`) */
    /* detached calls (em_detach.h): tasks' first finishers and rescuers, a task's time per
     * phase, and the caller's output (the stores go to the slot's ys rows) */
    int detached;
    atomic_uchar *won[3];
    atomic_uint *rescued_at[3]; /* 1 + µs since `began` of a task's latest rescue (0: none) */
    long began;                 /* the call's start (ns) */
    int repack;                 /* EM_TEST_STALL builds: this call packs twice (em_stall.h), */
    atomic_int repacked;        /* and its caller's second pack is done */
    atomic_long task_ns[3];
    float *final_out;
    int64_t final_stride;
    const int32_t *final_rows;
#if EM_PHASE_JOIN
    atomic_int up_done[EM_JOIN_MAX_JOBS]; /* gate_up tasks finished, per job */
#endif
} em_call;

static inline int64_t em_round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }
static inline float em_silu(float g) { return g / (1.0f + expf(-g)); }

#include "em_glu.h" /* the jobs' GLU and biases (uses the types above) */

static inline float em_x(const em_call *c, int64_t tok, int64_t k) {
    if (c->x_bf16) return em_bf16_to_f32(((const uint16_t *)c->x)[tok * c->x_stride + k]);
    return ((const float *)c->x)[tok * c->x_stride + k];
}

static inline uint32_t em_x_bf16(const em_call *c, int64_t tok, int64_t k) {
    if (k >= c->H) return 0;
    if (c->x_bf16) return ((const uint16_t *)c->x)[tok * c->x_stride + k];
    return em_f32_to_bf16(((const float *)c->x)[tok * c->x_stride + k]);
}

/* Token t's output row and its routing scale. */
static inline float *em_out_row(const em_call *c, const em_job *jb, int t) {
    int64_t orow = jb->out_rows ? ((const int32_t *)(intptr_t)jb->out_rows)[t] : t;
    return c->out + orow * c->out_stride;
}
static inline float em_scale(const em_job *jb, int t) { return jb->scale ? ((const float *)(intptr_t)jb->scale)[t] : 1.0f; }

/* out = scale · (v + the row's down bias): the bias before the routing weight, as the reference. */
static inline void em_store(const em_call *c, const em_job *jb, int t, int64_t row, float v) {
    if (jb->down_bias) v += em_bias_at(c, jb->down_bias, row); /* NOTE: no `+ 0`: it would turn -0 into +0 */
    em_out_row(c, jb, t)[row] = em_scale(jb, t) * v;
}

static inline int64_t em_token(const em_job *jb, int t) { return ((const int32_t *)(intptr_t)jb->tokens)[t]; }

/* Position of element i of a GEMV activation row: split layout for bf16, int4 and mxfp4 weights
 * (a lane or byte holds an even and an odd k), plain for int8 / fp8 (bytes widen in order). */
static inline int64_t em_xpos(const em_call *c, int64_t i) {
    return c->wfmt == EM_W_BF16 || em_nibbles(c->wfmt) ? em_split_pos(i) : i;
}

/* ---- phase 0: packing ---- */

#ifndef EM_PACK_PAIRS
/* Pairs of k a blocked job's pack task writes for all its tokens (a tuning macro; 0: one
 * token a task, every pair). NOTE: a pair's np tokens share a cache line (np = 16: one
 * line); a token a task put 16 threads' writes on every line of xp — the pack phase took
 * ~200 µs of a ~900 µs call of 8 experts × 16 tokens on the GPU machine (2026-12-04). */
#define EM_PACK_PAIRS 64
#endif

/* Pack tasks of a job: GEMV, a token each; blocked, pair ranges of xp and hp for all tokens. */
static int64_t em_pack_tasks(const em_call *c, const em_jobstate *s) {
    if (!s->gemm) return s->n;
    if (!EM_PACK_PAIRS) return s->np;
    int64_t pairs = c->Px > c->Ph ? c->Px : c->Ph;
    return (pairs + EM_PACK_PAIRS - 1) / EM_PACK_PAIRS;
}

/* Token t's pairs [p0, p1) of x into xp (zeros past H, and for padding tokens); its h
 * pairs there that gate_up will not write (past I/2, every one of a padding token's) zeroed. */
static void em_pack_token_pairs(const em_call *c, const em_job *jb, const em_jobstate *s, int t, int64_t p0,
                                int64_t p1) {
    const int64_t np = s->np, px = p1 < c->Px ? p1 : c->Px, ph = p1 < c->Ph ? p1 : c->Ph;
    if (t < s->n) {
        int64_t tok = em_token(jb, t), p = p0;
        if (c->x_bf16) { /* a pair of bf16 x is the 32 bits the tile reads: copied whole */
            const uint16_t *row = (const uint16_t *)c->x + tok * c->x_stride;
            for (; p < px && 2 * p + 1 < c->H; p++) memcpy(&s->xp[p * np + t], row + 2 * p, 4);
        }
        for (; p < px; p++) s->xp[p * np + t] = em_x_bf16(c, tok, 2 * p) | em_x_bf16(c, tok, 2 * p + 1) << 16;
    } else {
        for (int64_t p = p0; p < px; p++) s->xp[p * np + t] = 0;
    }
    /* NOTE: h pairs past I must read as zero. The last pair of an odd I is gate_up's, whole
     * (its half past I written as zero there): a pack task run twice (a detached call's
     * rescue, em_detach.h) may store late, and must not clear a pair gate_up has written. */
    int64_t z0 = t < s->n ? (c->I + 1) / 2 : 0;
    for (int64_t p = z0 > p0 ? z0 : p0; p < ph; p++) s->hp[p * np + t] = 0;
}

static void em_pack(const em_call *c, const em_job *jb, const em_jobstate *s, int q) {
    if (!s->gemm) {
        float *xs = s->xs + q * c->Hs, *hs = s->hs + q * c->Is;
        int64_t tok = em_token(jb, q);
        for (int64_t k = 0; k < c->Hs; k++) xs[em_xpos(c, k)] = k < c->H ? em_x(c, tok, k) : 0.0f;
        for (int64_t i = c->I; i < c->Is; i++) hs[em_xpos(c, i)] = 0.0f;
        return;
    }
    if (!EM_PACK_PAIRS) {
        em_pack_token_pairs(c, jb, s, q, 0, c->Px > c->Ph ? c->Px : c->Ph);
        return;
    }
    const int64_t p0 = (int64_t)q * EM_PACK_PAIRS, p1 = p0 + EM_PACK_PAIRS;
    for (int t = 0; t < s->np; t++) em_pack_token_pairs(c, jb, s, t, p0, p1);
}

#include "em_btasks.h" /* the bf16-weight tasks: GEMV and blocked tiles (uses the above) */

#include "em_qtasks.h" /* the quantised-weight tasks (uses everything above) */
#if EM_HAS_GEMM
#include "em_qjit.h"  /* AMX, int8 / fp8, one pair of token tiles: converting as the tiles go */
#endif
#include "em_qgemm.h" /* the quantised-weight GEMM tasks: em_qjit.h's path or em_qtasks.h's scratch */

#include "em_detach.h" /* detached calls: private state, commit, first finishers (uses the above) */
#include "em_sched.h" /* lanes, claims, the phases, the call's layout (uses everything above) */

/* ---- exported ---- */

int em_abi_version(void) { return EM_ABI_VERSION; }
const char *em_isa(void) { return EM_ISA_NAME; }

/* Linux asks a process to request AMX tile state before its first tile instruction. */
int em_amx_enable(void) {
#if defined(EM_ISA_AMX) && !defined(EM_AMX_EMULATE) && defined(__linux__)
    unsigned long bitmask = 0;
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */)) return -1;
    if (syscall(SYS_arch_prctl, 0x1022 /* ARCH_GET_XCOMP_PERM */, &bitmask)) return -2;
    return (bitmask & (1ul << 18)) ? 0 : -3;
#else
    return 0;
#endif
}

void *em_create(int nthreads, int spin_us) { return em_pool_new(nthreads, spin_us); }
int em_threads(void *pool) { return ((em_pool *)pool)->nthreads; }
void em_destroy(void *pool) { em_pool_destroy((em_pool *)pool); }

/* The call's state in `slot` (allocated at its first call), zeroed; NULL: out of memory. */
static em_call *em_slot_call(em_slot *slot) {
    if (!slot->call) slot->call = aligned_alloc(64, (size_t)em_round_up((int64_t)sizeof(em_call), 64));
    if (slot->call) memset(slot->call, 0, sizeof(em_call));
    return (em_call *)slot->call;
}

/* em_experts; `detached` (em_detach.h): the call returns without waiting for a late worker,
 * so every input (x, the weights and scales) must stay put after it returns — the jobs'
 * arrays are copied — and the output rows are written by the call only. */
static int em_experts_in(void *pool, const void *x, int x_bf16, int64_t x_stride, float *out, int64_t out_stride, int H,
                         int I, const em_job *jobs, int njobs, int gemm_min_tokens, int wfmt, int blk,
                         const em_glu_spec *glu, int detached) {
    if (!pool || H < 1 || I < 1 || njobs < 0 || (njobs && (!x || !out || !jobs))) return -1;
    if (wfmt < EM_W_BF16 || wfmt > EM_W_MXFP4 || !em_glu_ok(glu)) return -1;
    if ((wfmt == EM_W_FP8 || wfmt == EM_W_INT4) && (blk < 32 || blk % 32)) return -1;
    if (wfmt == EM_W_MXFP4 && blk != 32) return -1;
    if (njobs == 0) return 0;
    em_pool *p = (em_pool *)pool;
    pthread_mutex_lock(&p->call_lock);
    em_slot *slot = em_pool_slot(p);
    em_call *c = em_slot_call(slot);
    if (!c) {
        pthread_mutex_unlock(&p->call_lock);
        return -2;
    }
    c->pool = p;
    c->jobs = jobs;
    c->njobs = njobs;
    c->x = (const uint8_t *)x;
    c->x_bf16 = x_bf16;
    c->x_stride = x_stride;
    c->out = out;
    c->out_stride = out_stride;
    c->H = H;
    c->I = I;
    c->wfmt = wfmt;
    c->blk = blk;
    c->glu = *glu;
    c->Hs = em_round_up(H, 2 * EM_VW);
    c->Is = em_round_up(I, 2 * EM_VW);
    c->Px = em_round_up((H + 1) / 2, 16);
    c->Ph = em_round_up((I + 1) / 2, 16);
    c->detached = EM_DETACH && detached;
    c->began = c->detached ? em_now_ns() : 0; /* the rescues' clock (em_detach.h) */
    c->repack = c->detached && EM_REPACK_ARMED(); /* decided once: a late worker may look after a test disarms it */
    int rc = em_plan(c, slot, gemm_min_tokens);
    if (rc == 0) em_plan_lanes(c);
    c->join = EM_PHASE_JOIN && njobs > 1 && njobs <= EM_JOIN_MAX_JOBS && !c->detached;
    EM_PT_CALL_START();
    if (rc == 0) em_pool_run(p, slot, em_call_task, c, c->detached);
    EM_PT_CALL_END();
    if (rc == 0 && atomic_load(&c->failed)) rc = -2;
    pthread_mutex_unlock(&p->call_lock);
    return rc;
}

/* Runs `njobs` experts with weights in `wfmt` (EM_W_*; fp8 in blk x blk blocks, int4 in
 * groups of blk along K; blk a multiple of 32: AMX B tiles span 32 k, a block's tiles
 * must not read past the activations' padding, and an int4 group starts at a whole GEMV
 * step; mxfp4: blk 32), the GLU `act` (EM_ACT_*, swiglu_oai's alpha and limit) and the
 * jobs' biases in bf16 (bias_bf16 1) or fp32; returns 0, -1 (bad arguments) or -2 (out of
 * memory). Returns after every worker has left the call: the caller may free anything then. */
int em_experts(void *pool, const void *x, int x_bf16, int64_t x_stride, float *out, int64_t out_stride, int H, int I,
               const em_job *jobs, int njobs, int gemm_min_tokens, int wfmt, int blk, int act, float alpha, float limit,
               int bias_bf16) {
    const em_glu_spec glu = {act, alpha, limit, bias_bf16};
    return em_experts_in(pool, x, x_bf16, x_stride, out, out_stride, H, I, jobs, njobs, gemm_min_tokens, wfmt, blk,
                         &glu, 0);
}

/* out[4]: [tasks run again for a late worker, detached calls that returned with a worker
 * still inside, the most call slots in use at once] since the pool began, and the threads
 * inside a call slot now. */
void em_pool_stats(void *pool, int64_t *out) { em_pool_read_stats((em_pool *)pool, out); }

/* Returns once no worker is inside any call (a detached call's late ones included): call it
 * before freeing what the host function's calls read (a mailbox's buffers, its banks). */
void em_quiesce(void *pool) { em_pool_quiesce((em_pool *)pool); }

#include "em_host.h" /* em_host_layer: one layer's CPU share as a CUDA host function */
#include "em_copier.h" /* em_copier_*: a decode prefetch's copies issued on the copy engine (uses em_host.h's EM_PTR) */
