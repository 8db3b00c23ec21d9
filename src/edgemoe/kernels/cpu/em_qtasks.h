/* The quantised-weight tasks of expert.c (int8 / fp8 weights, em_quant.h; int4,
 * em_int4.h): GEMV (phase 1 gate_up, phase 2 down, few tokens) and blocked GEMM (many
 * tokens) over scale blocks (int4: groups).
 *
 * NOTE: included by expert.c after its types (em_call, em_job, em_jobstate), helpers
 * (em_store, em_glu, em_put_h_rows, em_store_rows) and the bf16 GEMM microkernels it reuses; not standalone.
 */
#ifndef EM_QTASKS_H
#define EM_QTASKS_H

/* ---- GEMV path, quantised weights ---- */

static inline int64_t em_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

#ifndef EM_QPF_GROUPS
#define EM_QPF_GROUPS 1 /* how many row groups ahead an int8 / fp8 GEMV prefetches */
#endif

/* Scales of row r of a projection: fp8, the row of block scales of its row block (gate_up:
 * gate and up blocked separately); int8, the row's own scale. */
static inline const float *em_row_scales(const em_call *c, const em_job *jb, int down, int64_t r) {
    const float *s = (const float *)(intptr_t)(down ? jb->down_scale : jb->gate_up_scale);
    if (c->wfmt == EM_W_INT8) return s + r;
    if (down) return s + (r / c->blk) * em_cdiv(c->I, c->blk);
    int64_t rb = (r / c->I) * em_cdiv(c->I, c->blk) + (r % c->I) / c->blk;
    return s + rb * em_cdiv(c->H, c->blk);
}

/* The factor a dot of row r is multiplied by: int8, its scale; fp8 rows are scaled inside. */
static inline float em_row_factor(const em_call *c, const float *sc) { return c->wfmt == EM_W_INT8 ? sc[0] : 1.0f; }

/* Row pointers, scales and dot factors of 4 rows of gate_up (down 0) or down (1). */
static inline void em_q_rows4(const em_call *c, const em_job *jb, int down, const int64_t *rows, const uint8_t **w,
                              const float **sc, float *f) {
    const uint8_t *base = (const uint8_t *)(intptr_t)(down ? jb->down : jb->gate_up);
    for (int j = 0; j < 4; j++) {
        w[j] = base + rows[j] * (down ? c->I : c->H);
        sc[j] = em_row_scales(c, jb, down, rows[j]);
        f[j] = em_row_factor(c, sc[j]);
    }
}

/* hs[i] = the GLU of the gate/up rows whose dots are at (g, u) of `dots` (em_glu). */
static inline void em_q_put(const em_call *c, const em_job *jb, const em_jobstate *s, int64_t i, const float *f,
                            const float *dots, int g, int u, int t0, int nt) {
    for (int t = 0; t < nt; t++)
        s->hs[(t0 + t) * c->Is + i] = em_glu(c, jb, i, f[g] * dots[g * nt + t], f[u] * dots[u * nt + t]);
}

#ifndef EM_QPAGES
#define EM_QPAGES 1
#endif
#ifndef EM_QPF_PAST
/* Whether a gate_up task's last group prefetches past the task: with lanes the next
 * task is the same thread's (its rows follow on), without them another thread's. */
#define EM_QPF_PAST EM_LANES
#endif
/* NOTE (the order of rows): at a byte a weight, gate rows i and i+1 share a 4 KiB page (H =
 * 2048), and reading both at once puts two streams in one page. With EM_QPAGES, 4 row
 * pairs (gate i..i+1, up i..i+1, gate i+2..i+3, up i+2..i+3) are read in two passes, the
 * pairs' first rows then their second rows (prefetched by the first pass): each page is
 * one stream read in order, as a bf16 row is. */
static void em_gate_up_gemv_q(const em_call *c, const em_job *jb, const em_jobstate *s, int64_t q) {
    const int64_t H = c->H, I = c->I;
    const int fp8 = c->wfmt == EM_W_FP8;
    int64_t i1 = (q + 1) * EM_P1_GEMV_Q < I ? (q + 1) * EM_P1_GEMV_Q : I;
    float da[4 * EM_NT], db[4 * EM_NT], fa[4], fb[4];
    const uint8_t *wa[4], *wb[4];
    const float *sa[4], *sb[4];
    for (int64_t i = q * EM_P1_GEMV_Q; i < i1;) {
        if (EM_QPAGES && i + 3 < i1) {
            const int64_t ra[4] = {i, I + i, i + 2, I + i + 2}, rb[4] = {i + 1, I + i + 1, i + 3, I + i + 3};
            em_q_rows4(c, jb, 0, ra, wa, sa, fa);
            em_q_rows4(c, jb, 0, rb, wb, sb, fb);
            for (int t0 = 0; t0 < s->n; t0 += EM_NT) {
                int nt = s->n - t0 < EM_NT ? s->n - t0 : EM_NT;
                const float *xs = s->xs + t0 * c->Hs;
                /* first pass prefetches the second rows; the second, the next group's first */
                em_gemv4q(wa, sa, c->blk, fp8, xs, c->Hs, nt, (int)H, H, da);
                em_gemv4q(wb, sb, c->blk, fp8, xs, c->Hs, nt, (int)H, EM_QPF_PAST || i + 4 < i1 ? 3 * H : 0, db);
                em_q_put(c, jb, s, i, fa, da, 0, 1, t0, nt);
                em_q_put(c, jb, s, i + 2, fa, da, 2, 3, t0, nt);
                em_q_put(c, jb, s, i + 1, fb, db, 0, 1, t0, nt);
                em_q_put(c, jb, s, i + 3, fb, db, 2, 3, t0, nt);
            }
            i += 4;
            continue;
        }
        int64_t i2 = i + 1 < i1 ? i + 1 : i;
        const int64_t rows[4] = {i, I + i, i2, I + i2};
        em_q_rows4(c, jb, 0, rows, wa, sa, fa);
        for (int t0 = 0; t0 < s->n; t0 += EM_NT) {
            int nt = s->n - t0 < EM_NT ? s->n - t0 : EM_NT;
            /* next group: 2 rows on; NOTE: past the task's last group only with lanes (pf 0
             * re-touches this one): without, those rows are another thread's, and reading
             * them here too cost int8 5% (8 experts at batch 1, 2 threads) */
            em_gemv4q(wa, sa, c->blk, fp8, s->xs + t0 * c->Hs, c->Hs, nt, (int)H,
                      EM_QPF_PAST || i + 2 * EM_QPF_GROUPS < i1 ? 2 * EM_QPF_GROUPS * H : 0, da);
            em_q_put(c, jb, s, i, fa, da, 0, 1, t0, nt);
            if (i2 != i) em_q_put(c, jb, s, i2, fa, da, 2, 3, t0, nt);
        }
        i += 2;
    }
}

#ifndef EM_QDN_STREAMS
#define EM_QDN_STREAMS 1
#endif
/* down: a whole task's rows as 4 streams (its quarters), each read in order, a row of each
 * a pass (EM_QDN_STREAMS; a partial task: 4 adjacent rows a pass). */
static void em_down_gemv_q(const em_call *c, const em_job *jb, const em_jobstate *s, int64_t q) {
    const int64_t I = c->I, r0 = q * EM_P2_GEMV_Q;
    const int fp8 = c->wfmt == EM_W_FP8;
    int64_t r1 = (q + 1) * EM_P2_GEMV_Q < c->H ? (q + 1) * EM_P2_GEMV_Q : c->H;
    const int streams = EM_QDN_STREAMS && r1 - r0 == EM_P2_GEMV_Q, quarter = EM_P2_GEMV_Q / 4;
    float dots[4 * EM_NT];
    for (int64_t p = 0; p < (streams ? quarter : r1 - r0); p += streams ? 1 : 4) {
        int nr = streams ? 4 : (r1 - r0 - p < 4 ? (int)(r1 - r0 - p) : 4);
        int64_t rows[4];
        const uint8_t *w[4];
        const float *sc[4];
        float f[4];
        for (int j = 0; j < 4; j++) rows[j] = streams ? r0 + j * quarter + p : r0 + p + (j < nr ? j : 0);
        em_q_rows4(c, jb, 1, rows, w, sc, f);
        /* prefetch: streams, EM_QPF_GROUPS rows on in each; else the next 4 rows. Within the task. */
        int64_t pf = streams ? (p + EM_QPF_GROUPS < quarter ? EM_QPF_GROUPS * I : 0)
                             : (r0 + p + 4 * EM_QPF_GROUPS < r1 ? 4 * EM_QPF_GROUPS * I : 0);
        for (int t0 = 0; t0 < s->n; t0 += EM_NT) {
            int nt = s->n - t0 < EM_NT ? s->n - t0 : EM_NT;
            em_gemv4q(w, sc, c->blk, fp8, s->hs + t0 * c->Is, c->Is, nt, (int)I, pf, dots);
            for (int j = 0; j < nr; j++)
                for (int t = 0; t < nt; t++) em_store(c, jb, t0 + t, rows[j], f[j] * dots[j * nt + t]);
        }
    }
}

/* ---- GEMV path, int4 and mxfp4 weights ---- */

/* Bytes a row of K nibbles takes: int4, ceil(K/2); mxfp4, whole blocks of 32 (16 bytes). */
static inline int64_t em_nib_row(const em_call *c, int64_t K) {
    return c->wfmt == EM_W_MXFP4 ? em_cdiv(K, 32) * 16 : em_cdiv(K, 2);
}

/* Rows `rows` of a projection (K inputs): data, fp16 scales and zero points of each. */
static void em_i4_rows(const em_call *c, const em_job *jb, int down, const int64_t *rows, em_i4rows *m) {
    const int64_t K = down ? c->I : c->H, nb = em_nib_row(c, K), G = em_cdiv(K, c->blk);
    const uint8_t *w = (const uint8_t *)(intptr_t)(down ? jb->down : jb->gate_up);
    const int64_t scales = down ? jb->down_scale : jb->gate_up_scale;
    const uint8_t *z = (const uint8_t *)(intptr_t)(down ? jb->down_zero : jb->gate_up_zero);
    m->mx = c->wfmt == EM_W_MXFP4;
    for (int j = 0; j < 4; j++) {
        m->w[j] = w + rows[j] * nb;
        m->s[j] = m->mx ? NULL : (const uint16_t *)(intptr_t)scales + rows[j] * G;
        m->e[j] = m->mx ? (const uint8_t *)(intptr_t)scales + rows[j] * G : NULL;
        m->z[j] = m->mx ? NULL : z + rows[j] * G;
    }
}

static void em_gate_up_gemv_i4(const em_call *c, const em_job *jb, const em_jobstate *s, int64_t q) {
    const int64_t H = c->H, I = c->I;
    int64_t i1 = (q + 1) * EM_P1_GEMV < I ? (q + 1) * EM_P1_GEMV : I;
    float dots[4 * EM_NT];
    em_i4rows m;
    for (int64_t i = q * EM_P1_GEMV; i < i1; i += 2) {
        int64_t i2 = i + 1 < i1 ? i + 1 : i;
        const int64_t rows[4] = {i, i2, I + i, I + i2};
        em_i4_rows(c, jb, 0, rows, &m);
        for (int t0 = 0; t0 < s->n; t0 += EM_NT) {
            int nt = s->n - t0 < EM_NT ? s->n - t0 : EM_NT;
            /* next group: 2 rows on */
            em_gemv4_i4(&m, c->blk, s->xs + t0 * c->Hs, c->Hs, nt, (int)H, 2 * em_nib_row(c, H), dots);
            for (int t = 0; t < nt; t++) {
                float *hs = s->hs + (t0 + t) * c->Is;
                hs[em_split_pos(i)] = em_glu(c, jb, i, dots[t], dots[2 * nt + t]);
                if (i2 != i) hs[em_split_pos(i2)] = em_glu(c, jb, i2, dots[nt + t], dots[3 * nt + t]);
            }
        }
    }
}

static void em_down_gemv_i4(const em_call *c, const em_job *jb, const em_jobstate *s, int64_t q) {
    const int64_t I = c->I;
    int64_t r1 = (q + 1) * EM_P2_GEMV < c->H ? (q + 1) * EM_P2_GEMV : c->H;
    float dots[4 * EM_NT];
    em_i4rows m;
    for (int64_t r = q * EM_P2_GEMV; r < r1; r += 4) {
        int nr = r1 - r < 4 ? (int)(r1 - r) : 4;
        int64_t rows[4];
        for (int j = 0; j < 4; j++) rows[j] = r + (j < nr ? j : 0);
        em_i4_rows(c, jb, 1, rows, &m);
        for (int t0 = 0; t0 < s->n; t0 += EM_NT) {
            int nt = s->n - t0 < EM_NT ? s->n - t0 : EM_NT;
            em_gemv4_i4(&m, c->blk, s->hs + t0 * c->Is, c->Is, nt, (int)I, 4 * em_nib_row(c, I), dots); /* 4 rows on */
            for (int j = 0; j < nr; j++)
                for (int t = 0; t < nt; t++) em_store(c, jb, t0 + t, r + j, dots[j * nt + t]);
        }
    }
}

/* ---- GEMM path, quantised weights ---- */

#if EM_HAS_GEMM
#if defined(EM_ISA_AMX)
#define EM_QHALF 16 /* rows per A tile: gate rows in tile 0, up rows in tile 1 */
#else
#define EM_QHALF (EM_GR / 2)
#endif

#ifndef EM_QPAD
/* bf16 values of padding after each scratch row (a tuning macro): rows 4 KiB apart (H =
 * 2048) fall in one L1 set, and an A tile's 16 rows (two tiles: 32) outnumber its 12 ways.
 * fp8 at 16 experts × 16 / 32 tokens: ×1.045 / ×1.06 against 0 (cpu-ab, 2026-12-04). */
#define EM_QPAD 32
#endif

/* Row r of a projection → its K weights in bf16 with their scales folded in, each the
 * reference's fp32 value rounded once to nearest even. The task's tiles then run the bf16
 * kernels over the whole row (em_gate_up_tiles, em_down_tiles), as for bf16 weights. */
static void em_qrow_bf16(const em_call *c, const em_job *jb, int down, int64_t r, uint16_t *out) {
    const int64_t K = down ? c->I : c->H;
    if (em_nibbles(c->wfmt)) {
        const int64_t rows[4] = {r, r, r, r};
        em_i4rows m;
        em_i4_rows(c, jb, down, rows, &m);
        em_i4_to_bf16(&m, c->blk, (int)K, out);
    } else {
        const uint8_t *w = (const uint8_t *)(intptr_t)(down ? jb->down : jb->gate_up);
        em_q_to_bf16(w + r * K, (int)K, c->wfmt == EM_W_FP8, em_row_scales(c, jb, down, r), c->blk, out);
    }
}

#endif

#endif
