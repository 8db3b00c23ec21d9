/* The quantised blocked path's tiles converting as they go (AMX, int8 / fp8 weights, a
 * job of at most EM_QJIT_NP padded tokens): each k-step converts the 32 rows' next 32
 * weights, unscaled, into a tile-sized bf16 buffer in L1 and multiplies it at once; the
 * scales multiply the fp32 partial sums instead — fp8's per scale block (the rows of a
 * 16-row tile share their row block, so it is one scalar a tile and block), int8's per
 * row at the end.
 *
 * Why: the scaled conversion (em_q_to_bf16: fp16 trick, fp32 product, bf16 rounding,
 * ~14 vector uops per 32 weights) held the row-at-a-time path (em_qtasks.h), which
 * converts a task's 32 whole rows into a 133 KB scratch before its tiles: on the GPU
 * machine's AMX (fp8, 8 experts × 16 tokens) conversion was 75% of the tasks' time, and
 * the call's rate was flat in tokens. An e4m3 value is exact in bf16 (4 significant
 * bits, exponents 2^-9..2^8), built from the byte with integer operations (~7 uops per
 * 32; em_qexact.h); an int8 value is too (7 bits). Measured: ×1.09–1.16 the scratch
 * path's rate for fp8, ×1.04–1.11 for int8, at 6–32 tokens (docs/benchmarks.md, "The
 * quantised blocked path converting as it goes"); the same loop with the scaled
 * conversion was slower than the scratch path.
 *
 * The numbers: each weight exact (the scaled path rounds w · scale to bf16), x and h in
 * bf16 as everywhere on the blocked path, fp32 sums scaled in fp32. A job of more token
 * tiles would convert each k-step once per pair of them; those keep the scratch path.
 *
 * NOTE: included by expert.c after em_qtasks.h (its scales, em_row_scales); not standalone.
 */
#ifndef EM_QJIT_H
#define EM_QJIT_H

#if defined(EM_ISA_AMX)
#include "em_qexact.h" /* the conversion: each weight's exact bf16 value */

#ifndef EM_QJIT_NP
#define EM_QJIT_NP 32 /* the most padded tokens a job converts as it goes (0: never) */
#endif
#ifndef EM_QJIT_PF
#define EM_QJIT_PF 256 /* bytes ahead a raw row's prefetch reads (8 k-steps) */
#endif

/* The 32 raw rows of a k-step's two A tiles (tile 0's n0, then tile 1's n1 from 16). */
typedef struct {
    const uint8_t *w[32];
    const float *sc[32]; /* fp8: the row's block scales, one per blk columns; int8: its one */
    int n0, n1;
} em_qrows32;

/* out (em_amx_2x2's layout, rows 0..31 × tv token tiles) = f · part + (first ? 0 : out),
 * f per row (int8) or per 16-row tile (fp8, f[0] and f[16]). */
static inline void em_q_scale_rows(float *out, const float *part, const float *f, int per_row, int tv, int first) {
    for (int r = 0; r < 32; r++) {
        const __m512 s = _mm512_set1_ps(f[per_row ? r : r & 16]);
        for (int v = 0; v < tv; v++) {
            /* NOTE: out is the caller's, unaligned accesses: with aligned ones here and the
             * callers' arrays unaligned, the amx build segfaulted on the GPU machine */
            __m512 p = _mm512_mul_ps(s, _mm512_load_ps(part + r * 32 + v * 16));
            _mm512_storeu_ps(out + r * 32 + v * 16, first ? p : _mm512_add_ps(p, _mm512_loadu_ps(out + r * 32 + v * 16)));
        }
    }
}

/* C tiles 0..3 → part (em_amx_2x2's layout), then zeroed. */
static inline void em_q_take_c(float *part, int two) {
    EM_TSTORE(0, part, 32 * 4);
    EM_TSTORE(2, part + 16 * 32, 32 * 4);
    EM_TZERO(0);
    EM_TZERO(2);
    if (two) {
        EM_TSTORE(1, part + 16, 32 * 4);
        EM_TSTORE(3, part + 16 * 32 + 16, 32 * 4);
        EM_TZERO(1);
        EM_TZERO(3);
    }
}

/* k-step j's 32 rows × 32 weights of m → a[0] (tile 0's rows), a[1] (tile 1's),
 * prefetching the rows' bytes EM_QJIT_PF on. NOTE: converting a k-step or more ahead of
 * the tiles that load it (a ring of buffers) was measured neutral on the GPU machine
 * (0..3 ahead within ±3%, 2026-12-04): the plain order. */
static inline __attribute__((always_inline)) void em_q_convert_step(const em_qrows32 *m, int j, int K, const int fp8,
                                                                    __m512i sub, uint16_t (*a)[16 * 32]) {
    const int k0 = 32 * j;
#if !defined(EM_AMX_EMULATE)
    if ((k0 & 63) == 0 && k0 + EM_QJIT_PF < K) { /* a line a row every other k-step */
        for (int r = 0; r < m->n0; r++) __builtin_prefetch(m->w[r] + k0 + EM_QJIT_PF, 0, 3);
        for (int r = 16; r < 16 + m->n1; r++) __builtin_prefetch(m->w[r] + k0 + EM_QJIT_PF, 0, 3);
    }
#endif
    for (int r = 0; r < m->n0; r++) em_q32_exact(m->w[r], k0, K, fp8, sub, a[0] + r * 32);
    for (int r = 16; r < 16 + m->n1; r++) em_q32_exact(m->w[r], k0, K, fp8, sub, a[1] + (r - 16) * 32);
}

/* em_amx_2x2 over the rows of m, weights exact and scaled after (blk: fp8's block, a
 * multiple of 32): out[(tile*16 + r)*32 + v*16 + lane], tokens t0.. (t0 + 16.. if two). */
static void em_amx_2x2_q(const em_qrows32 *m, const int fp8, int blk, int K, const uint32_t *xp, int64_t np, int t0,
                         int two, float *out) {
    uint16_t a[2][16 * 32] __attribute__((aligned(64)));
    float part[32 * 32] __attribute__((aligned(64))), f[32];
    if (m->n0 < 16 || m->n1 < 16) memset(a, 0, sizeof(a)); /* rows past n: zeros, never stored */
    const __m512i sub = em_e4m3_sub_lut();
    EM_TZERO(0);
    EM_TZERO(1);
    EM_TZERO(2);
    EM_TZERO(3);
    const int steps = (K + 31) / 32, per_block = fp8 ? blk / 32 : steps; /* k-steps a scale block (int8: all) */
    for (int j = 0; j < steps; j++) {
        em_q_convert_step(m, j, K, fp8, sub, a);
        em_amx_step(a[0], 64, a[1], 64, xp + (int64_t)(16 * j) * np + t0, np, two);
        if (fp8 && ((j + 1) % per_block == 0 || j + 1 == steps)) { /* a block's sums, times each tile's scale */
            const int kb = j / per_block;
            em_q_take_c(part, two);
            f[0] = m->sc[0][kb], f[16] = m->n1 ? m->sc[16][kb] : 0.0f;
            em_q_scale_rows(out, part, f, 0, two ? 2 : 1, kb == 0);
        }
    }
    if (!fp8) {
        em_q_take_c(part, two);
        for (int r = 0; r < 32; r++) f[r] = r < m->n0 || (r >= 16 && r < 16 + m->n1) ? m->sc[r][0] : 0.0f;
        em_q_scale_rows(out, part, f, 1, two ? 2 : 1, 1);
    }
}

#if defined(EM_TEST_HOOKS) && EM_TEST_HOOKS
/* For tests: a row of K weights → the bf16 values the tiles read (em_q32_exact). */
void em_test_q_exact(const uint8_t *w, int K, int fp8, uint16_t *out) {
    uint16_t tmp[32] __attribute__((aligned(64)));
    for (int k0 = 0; k0 < K; k0 += 32) {
        em_q32_exact(w, k0, K, fp8, em_e4m3_sub_lut(), tmp);
        memcpy(out + k0, tmp, (size_t)(K - k0 < 32 ? K - k0 : 32) * 2);
    }
}
#endif

/* Whether a job's blocked tasks convert as they go: int8 / fp8, one pair of token tiles. */
static inline int em_qjit(const em_call *c, const em_jobstate *s) {
    return EM_QJIT_NP && s->np <= EM_QJIT_NP && !em_nibbles(c->wfmt);
}

/* gate_up rows [lo, hi) of a job: 16 gate rows in tile 0, their up rows in tile 1. */
static void em_gate_up_qjit(const em_call *c, const em_job *jb, const em_jobstate *s, int64_t lo, int64_t hi) {
    const int64_t H = c->H, I = c->I;
    const uint8_t *base = (const uint8_t *)(intptr_t)jb->gate_up;
    float tmp[32 * 32] __attribute__((aligned(64)));
    em_qrows32 m;
    for (int64_t i0 = lo; i0 < hi; i0 += 16) {
        int nv = hi - i0 < 16 ? (int)(hi - i0) : 16;
        for (int r = 0; r < nv; r++) {
            m.w[r] = base + (i0 + r) * H, m.sc[r] = em_row_scales(c, jb, 0, i0 + r);
            m.w[16 + r] = base + (I + i0 + r) * H, m.sc[16 + r] = em_row_scales(c, jb, 0, I + i0 + r);
        }
        m.n0 = m.n1 = nv;
        em_amx_2x2_q(&m, c->wfmt == EM_W_FP8, c->blk, (int)H, s->xp, s->np, 0, s->np > 16, tmp);
        em_put_h_rows(c, jb, s, i0, nv, 0, em_tile_tokens(s, 0), tmp, 16);
    }
}

/* down rows [lo, hi) of a job, 32 a k-step (16 a tile). */
static void em_down_qjit(const em_call *c, const em_job *jb, const em_jobstate *s, int64_t lo, int64_t hi) {
    const uint8_t *base = (const uint8_t *)(intptr_t)jb->down;
    float tmp[32 * 32] __attribute__((aligned(64)));
    em_qrows32 m;
    for (int64_t r0 = lo; r0 < hi; r0 += 32) {
        int nr = hi - r0 < 32 ? (int)(hi - r0) : 32;
        m.n0 = nr < 16 ? nr : 16;
        m.n1 = nr - m.n0;
        for (int j = 0; j < nr; j++) m.w[j] = base + (r0 + j) * c->I, m.sc[j] = em_row_scales(c, jb, 1, r0 + j);
        em_amx_2x2_q(&m, c->wfmt == EM_W_FP8, c->blk, (int)c->I, s->hp, s->np, 0, s->np > 16, tmp);
        em_store_rows(c, jb, s, tmp, 0, em_tile_tokens(s, 0), r0, nr);
    }
}

/* A gate_up (down 0) or down task's rows [lo, hi), converting as it goes; its time counts
 * as the tiles' in EM_PHASE_TIMES builds (the conversion is inside the k-loop). */
static void em_qjit_task(const em_call *c, const em_job *jb, const em_jobstate *s, int down, int64_t lo, int64_t hi) {
    long t0 = EM_PT_NOW();
    if (down)
        em_down_qjit(c, jb, s, lo, hi);
    else
        em_gate_up_qjit(c, jb, s, lo, hi);
    EM_PT_ADD(1, EM_PT_NOW() - t0);
}
#endif

#endif
