/* The bf16-weight tasks of expert.c: the GEMV (phase 1 gate_up, phase 2 down, few tokens)
 * and the blocked tiles (AMX or AVX-512 BF16, many tokens) that the quantised blocked
 * tasks reuse over their dequantised rows (em_qgemm.h). Each gate_up task ends in the
 * call's GLU (em_glu.h), each down task in em_store / em_store_rows.
 *
 * NOTE: included by expert.c after its types and helpers (em_call, em_job, em_jobstate,
 * em_store, em_glu); not standalone.
 */
#ifndef EM_BTASKS_H
#define EM_BTASKS_H

/* ---- GEMV path ---- */

static void em_gate_up_gemv(const em_call *c, const em_job *jb, const em_jobstate *s, int64_t q) {
    const uint16_t *gu = (const uint16_t *)(intptr_t)jb->gate_up;
    const int64_t H = c->H, I = c->I;
    int64_t i1 = (q + 1) * EM_P1_GEMV < I ? (q + 1) * EM_P1_GEMV : I;
    float dots[4 * EM_NT];
    for (int64_t i = q * EM_P1_GEMV; i < i1; i += 2) {
        int64_t i2 = i + 1 < i1 ? i + 1 : i;
        const uint16_t *w[4] = {gu + i * H, gu + i2 * H, gu + (I + i) * H, gu + (I + i2) * H};
        for (int t0 = 0; t0 < s->n; t0 += EM_NT) {
            int nt = s->n - t0 < EM_NT ? s->n - t0 : EM_NT;
            em_gemv4(w, s->xs + t0 * c->Hs, c->Hs, nt, (int)H, 2 * H, dots); /* next group: 2 rows on */
            for (int t = 0; t < nt; t++) {
                float *hs = s->hs + (t0 + t) * c->Is;
                hs[em_split_pos(i)] = em_glu(c, jb, i, dots[t], dots[2 * nt + t]);
                if (i2 != i) hs[em_split_pos(i2)] = em_glu(c, jb, i2, dots[nt + t], dots[3 * nt + t]);
            }
        }
    }
}

#ifndef EM_DN_STREAMS
#define EM_DN_STREAMS 1
#endif
/* down: a whole task's rows as 4 streams (its quarters), each read in order, a row of each
 * a pass (EM_DN_STREAMS; a partial task: 4 adjacent rows a pass), as em_down_gemv_q. */
static void em_down_gemv(const em_call *c, const em_job *jb, const em_jobstate *s, int64_t q) {
    const uint16_t *dn = (const uint16_t *)(intptr_t)jb->down;
    const int64_t I = c->I, r0 = q * EM_P2_GEMV;
    int64_t r1 = (q + 1) * EM_P2_GEMV < c->H ? (q + 1) * EM_P2_GEMV : c->H;
    const int streams = EM_DN_STREAMS && r1 - r0 == EM_P2_GEMV, quarter = EM_P2_GEMV / 4;
    float dots[4 * EM_NT];
    for (int64_t p = 0; p < (streams ? quarter : r1 - r0); p += streams ? 1 : 4) {
        int nr = streams ? 4 : (r1 - r0 - p < 4 ? (int)(r1 - r0 - p) : 4);
        int64_t rows[4];
        const uint16_t *w[4];
        for (int j = 0; j < 4; j++) {
            rows[j] = streams ? r0 + j * quarter + p : r0 + p + (j < nr ? j : 0);
            w[j] = dn + rows[j] * I;
        }
        int64_t pf = streams ? I : 4 * I; /* the next row of each stream, or the next 4 rows */
        for (int t0 = 0; t0 < s->n; t0 += EM_NT) {
            int nt = s->n - t0 < EM_NT ? s->n - t0 : EM_NT;
            em_gemv4(w, s->hs + t0 * c->Is, c->Is, nt, (int)I, pf, dots);
            for (int j = 0; j < nr; j++)
                for (int t = 0; t < nt; t++) em_store(c, jb, t0 + t, rows[j], dots[j * nt + t]);
        }
    }
}

/* ---- GEMM path ---- */

#if EM_HAS_GEMM
#include "em_epilogue.h" /* the vector epilogues (uses the types above) */
#endif

/* The tiles of a gate_up task and of a down task over bf16 rows read in place (row stride
 * ld): the bf16 weights' own rows, or a quantised task's rows dequantised into its scratch
 * (em_qtasks.h). Gate rows g and up rows u (nv each) → h rows i0.. for every token tile;
 * down rows w (nr) → output rows r0.. */
#if defined(EM_ISA_AMX)
static void em_gate_up_tiles(const em_call *c, const em_job *jb, const em_jobstate *s, const uint16_t *g,
                             const uint16_t *u, int64_t ld, int64_t i0, int nv, int K) {
    float tmp[32 * 32];
    for (int t0 = 0; t0 < s->np; t0 += 32) {
        em_amx_2x2(g, nv, u, nv, ld, s->xp, s->np, t0, s->np - t0 > 16, K, tmp);
        em_put_h_rows(c, jb, s, i0, nv, t0, em_tile_tokens(s, t0), tmp, 16);
    }
}

static void em_down_tiles(const em_call *c, const em_job *jb, const em_jobstate *s, const uint16_t *w, int64_t ld,
                          int64_t r0, int nr) {
    int n0 = nr < 16 ? nr : 16, n1 = nr - n0; /* n1 > 0 only when n0 is 16 */
    float tmp[32 * 32];
    for (int t0 = 0; t0 < s->np; t0 += 32) {
        em_amx_2x2(w, n0, n1 ? w + 16 * ld : w, n1, ld, s->hp, s->np, t0, s->np - t0 > 16, (int)c->I, tmp);
        em_store_rows(c, jb, s, tmp, t0, em_tile_tokens(s, t0), r0, nr);
    }
}

static void em_gate_up_gemm(const em_call *c, const em_job *jb, const em_jobstate *s, int64_t q) {
    const uint16_t *gu = (const uint16_t *)(intptr_t)jb->gate_up;
    const int64_t H = c->H, I = c->I, i0 = q * 16;
    em_gate_up_tiles(c, jb, s, gu + i0 * H, gu + (I + i0) * H, H, i0, I - i0 < 16 ? (int)(I - i0) : 16, (int)H);
}

static void em_down_gemm(const em_call *c, const em_job *jb, const em_jobstate *s, int64_t q) {
    const int64_t r0 = q * 32;
    em_down_tiles(c, jb, s, (const uint16_t *)(intptr_t)jb->down + r0 * c->I, c->I, r0,
                  c->H - r0 < 32 ? (int)(c->H - r0) : 32);
}
#elif defined(EM_ISA_AVX512)
static void em_gemm12(const uint16_t *const *w, const uint32_t *xp, int64_t np, int t0, int K, float *out) {
    if (np - t0 >= 32)
        em_gemm12_2(w, xp, np, t0, K, out);
    else
        em_gemm12_1(w, xp, np, t0, K, out);
}

static void em_gate_up_tiles(const em_call *c, const em_job *jb, const em_jobstate *s, const uint16_t *g,
                             const uint16_t *u, int64_t ld, int64_t i0, int nv, int K) {
    const uint16_t *w[EM_GR];
    float tmp[EM_GR * 32];
    for (int j = 0; j < EM_GR / 2; j++) { /* rows past nv repeat the first: computed, never stored */
        w[j] = g + (j < nv ? j : 0) * ld;
        w[EM_GR / 2 + j] = u + (j < nv ? j : 0) * ld;
    }
    for (int t0 = 0; t0 < s->np; t0 += 32) {
        em_gemm12(w, s->xp, s->np, t0, K, tmp);
        em_put_h_rows(c, jb, s, i0, nv, t0, em_tile_tokens(s, t0), tmp, EM_GR / 2);
    }
}

static void em_down_tiles(const em_call *c, const em_job *jb, const em_jobstate *s, const uint16_t *rows, int64_t ld,
                          int64_t r0, int nr) {
    const uint16_t *w[EM_GR];
    float tmp[EM_GR * 32];
    for (int j = 0; j < EM_GR; j++) w[j] = rows + (j < nr ? j : 0) * ld;
    for (int t0 = 0; t0 < s->np; t0 += 32) {
        em_gemm12(w, s->hp, s->np, t0, (int)c->I, tmp);
        em_store_rows(c, jb, s, tmp, t0, 32, r0, nr);
    }
}

static void em_gate_up_gemm(const em_call *c, const em_job *jb, const em_jobstate *s, int64_t q) {
    const uint16_t *gu = (const uint16_t *)(intptr_t)jb->gate_up;
    const int64_t H = c->H, I = c->I;
    int64_t i1 = (q + 1) * EM_P1_GEMM < I ? (q + 1) * EM_P1_GEMM : I;
    for (int64_t i = q * EM_P1_GEMM; i < i1; i += EM_GR / 2)
        em_gate_up_tiles(c, jb, s, gu + i * H, gu + (I + i) * H, H, i, i1 - i < EM_GR / 2 ? (int)(i1 - i) : EM_GR / 2,
                         (int)H);
}

static void em_down_gemm(const em_call *c, const em_job *jb, const em_jobstate *s, int64_t q) {
    const uint16_t *dn = (const uint16_t *)(intptr_t)jb->down;
    int64_t r1 = (q + 1) * EM_P2_GEMM < c->H ? (q + 1) * EM_P2_GEMM : c->H;
    for (int64_t r = q * EM_P2_GEMM; r < r1; r += EM_GR)
        em_down_tiles(c, jb, s, dn + r * c->I, c->I, r, r1 - r < EM_GR ? (int)(r1 - r) : EM_GR);
}
#endif

#endif
