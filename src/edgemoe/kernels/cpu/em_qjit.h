/* The quantised blocked path's tiles converting as they go (AMX, int8 / fp8 weights, a
 * job of at most EM_QJIT_NP padded tokens): each k-step converts the 32 rows' next 32
 * weights into a tile-sized bf16 buffer in L1 and multiplies it at once, while the rows'
 * bytes further on are prefetched.
 *
 * Why: the row-at-a-time path (em_qtasks.h) converts a task's 32 whole rows into a
 * 133 KB scratch, then runs the tiles over it. Its memory reads stop while the tiles run,
 * and its conversion waits on them: on the GPU machine's AMX (fp8, 8 experts × 16
 * tokens) conversion was 75% of the tasks' time and the call read 39 GB/s
 * (docs/benchmarks.md, "The blocked path converting as it goes"). Here the reads stream
 * as the bf16 tiles' do. A job of more token tiles would convert each k-step once per
 * pair of them; those keep the scratch path, which converts a row once for all.
 *
 * The values are the scratch path's, bit for bit: each weight the reference's fp32
 * dequantisation (one rounding) rounded once more to bf16's nearest even, zeros past K.
 *
 * NOTE: included by em_qtasks.h inside its blocked-path section; not standalone.
 */
#ifndef EM_QJIT_H
#define EM_QJIT_H

#if defined(EM_ISA_AMX)
#ifndef EM_QJIT_NP
#define EM_QJIT_NP 32 /* the most padded tokens a job converts as it goes (0: never) */
#endif
#ifndef EM_QJIT_PF
#define EM_QJIT_PF 512 /* bytes ahead a raw row's prefetch reads (16 k-steps) */
#endif

/* The 32 raw rows of a k-step's two A tiles (tile 0's n0, then tile 1's n1 from 16). */
typedef struct {
    const uint8_t *w[32];
    const float *sc[32]; /* fp8: the row's block scales, one per blk columns; int8: its one */
    int n0, n1;
} em_qrows32;

/* 32 weights of row w from k0 → bf16 at out, scaled by f (fp8: the block's scale·2^8). */
static inline __attribute__((always_inline)) void em_q32_bf16(const uint8_t *w, int k0, int K, const int fp8, float f,
                                                              uint16_t *out) {
    __m512 lo = em_q16_scaled(w, k0, K, fp8, f);
    __m512 hi = k0 + 16 < K ? em_q16_scaled(w, k0 + 16, K, fp8, f) : _mm512_setzero_ps();
    _mm512_store_si512(out, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

/* Rows [r0, r1) of m from k0 into the tile buffer a (row r at a + (r - r0) * 32). */
static inline __attribute__((always_inline)) void em_q_tile_rows(const em_qrows32 *m, int r0, int r1, int k0, int kb,
                                                                 int K, const int fp8, uint16_t *a) {
    for (int r = r0; r < r1; r++)
        em_q32_bf16(m->w[r], k0, K, fp8, fp8 ? m->sc[r][kb] * EM_FP8_UNBIAS : m->sc[r][0], a + (r - r0) * 32);
}

/* em_amx_2x2 over the rows of m (blk: fp8's block, a multiple of 32): C tiles 0..3 =
 * rows (tile 0's, tile 1's) × tokens (t0, t0 + 16 if two), out as em_amx_2x2's. */
static void em_amx_2x2_q(const em_qrows32 *m, const int fp8, int blk, int K, const uint32_t *xp, int64_t np, int t0,
                         int two, float *out) {
    /* two buffers a tile, used in turn: a k-step's conversion need not wait on the loads
     * of the one before */
    uint16_t a[2][2][16 * 32] __attribute__((aligned(64)));
    if (m->n0 < 16 || m->n1 < 16) memset(a, 0, sizeof(a)); /* rows past n: zeros, never stored */
    EM_TZERO(0);
    EM_TZERO(1);
    EM_TZERO(2);
    EM_TZERO(3);
    for (int k0 = 0, kb = 0, kend = blk, turn = 0; k0 < K; k0 += 32, turn ^= 1) {
        if (fp8 && k0 == kend) kb++, kend += blk;
#if !defined(EM_AMX_EMULATE)
        if ((k0 & 63) == 0 && k0 + EM_QJIT_PF < K) { /* a line a row every other k-step */
            for (int r = 0; r < m->n0; r++) __builtin_prefetch(m->w[r] + k0 + EM_QJIT_PF, 0, 3);
            for (int r = 16; r < 16 + m->n1; r++) __builtin_prefetch(m->w[r] + k0 + EM_QJIT_PF, 0, 3);
        }
#endif
        em_q_tile_rows(m, 0, m->n0, k0, kb, K, fp8, a[turn][0]);
        em_q_tile_rows(m, 16, 16 + m->n1, k0, kb, K, fp8, a[turn][1]);
        const uint32_t *b = xp + (int64_t)(k0 / 2) * np + t0;
        EM_TLOAD(4, a[turn][0], 64);
        EM_TLOAD(5, a[turn][1], 64);
        EM_TLOAD(6, b, np * 4);
        EM_TDP(0, 4, 6);
        EM_TDP(2, 5, 6);
        if (two) {
            EM_TLOAD(7, b + 16, np * 4);
            EM_TDP(1, 4, 7);
            EM_TDP(3, 5, 7);
        }
    }
    EM_TSTORE(0, out, 32 * 4);
    EM_TSTORE(2, out + 16 * 32, 32 * 4);
    if (two) {
        EM_TSTORE(1, out + 16, 32 * 4);
        EM_TSTORE(3, out + 16 * 32 + 16, 32 * 4);
    }
}

/* Whether a job's blocked tasks convert as they go: int8 / fp8, one pair of token tiles. */
static inline int em_qjit(const em_call *c, const em_jobstate *s) {
    return s->np <= EM_QJIT_NP && !em_nibbles(c->wfmt);
}

/* gate_up rows [lo, hi) of a job: 16 gate rows in tile 0, their up rows in tile 1. */
static void em_gate_up_qjit(const em_call *c, const em_job *jb, const em_jobstate *s, int64_t lo, int64_t hi) {
    const int64_t H = c->H, I = c->I;
    const uint8_t *base = (const uint8_t *)(intptr_t)jb->gate_up;
    float tmp[32 * 32];
    em_qrows32 m;
    for (int64_t i0 = lo; i0 < hi; i0 += 16) {
        int nv = hi - i0 < 16 ? (int)(hi - i0) : 16;
        for (int r = 0; r < nv; r++) {
            m.w[r] = base + (i0 + r) * H, m.sc[r] = em_row_scales(c, jb, 0, i0 + r);
            m.w[16 + r] = base + (I + i0 + r) * H, m.sc[16 + r] = em_row_scales(c, jb, 0, I + i0 + r);
        }
        m.n0 = m.n1 = nv;
        em_amx_2x2_q(&m, c->wfmt == EM_W_FP8, c->blk, (int)H, s->xp, s->np, 0, s->np > 16, tmp);
        em_put_h_rows(s, i0, nv, 0, em_tile_tokens(s, 0), tmp, 16);
    }
}

/* down rows [lo, hi) of a job, 32 a k-step (16 a tile). */
static void em_down_qjit(const em_call *c, const em_job *jb, const em_jobstate *s, int64_t lo, int64_t hi) {
    const uint8_t *base = (const uint8_t *)(intptr_t)jb->down;
    float tmp[32 * 32];
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
#endif

#endif
