/* The blocked (GEMM) path's epilogues, 16 tokens or rows a vector (AVX-512: the amx and
 * avx512 builds). Included by expert.c after its types; uses em_call / em_job / em_jobstate.
 *
 * A microkernel leaves its result as a tile of fp32 rows of 32 token columns
 * (tile[r * 32 + tt]). Written one value at a time — a libm expf per SiLU, an index and a
 * scale lookup per output — the epilogues cost more than the tile products once a job has
 * 16+ tokens (bench bw's prompt shapes: 2 TFLOP/s of AMX's ~30). Here:
 * - gate_up: h = silu(gate) · up for two rows at once, rounded to bf16 and stored as the
 *   rows' pairs for 16 tokens in one 64-byte store (the pair layout of hp);
 * - down: for each token, 16 rows gathered from the tile's column and stored contiguously
 *   into the token's output row, times its routing scale.
 * The padding tokens' columns (np past n) are exactly zero (their activations are), so
 * gate_up writes them too: silu(0) · 0 = 0, what the pack left there. With biases (em_glu.h)
 * they hold the GLU of the biases instead: only their own output columns see it, and those
 * are never stored. The rows past I stay zero either way (the odd row's partner below).
 */
#ifndef EM_EPILOGUE_H
#define EM_EPILOGUE_H

#include <immintrin.h>

#ifndef EM_VEC_EPILOGUE
#define EM_VEC_EPILOGUE 1 /* 0: one value at a time (libm expf, em_store): the A/B's other arm */
#endif

/* e^x for 16 lanes: 2^n · e^(f·ln2), f = x·log2(e) − n in [−0.5, 0.5], a degree-6 Taylor
 * polynomial (relative error < 2e-7 there; x·log2(e)'s own rounding adds < 1e-5 at
 * |x| = 88) — far below the bf16 rounding every h takes next. Overflow → inf, underflow
 * → 0 (scalef), NaN stays NaN. */
static inline __m512 em_exp16(__m512 x) {
    const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 y = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.693147180559945309f));
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* silu(g) · u for 16 lanes. */
static inline __m512 em_swiglu16(__m512 g, __m512 u) {
    const __m512 e = em_exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

/* gpt-oss's clamped SwiGLU for 16 lanes, em_swiglu_oai's operations (the limit as min's and
 * max's first operand: a NaN lane is passed on, as the scalar's comparisons do). */
static inline __m512 em_swiglu_oai16(__m512 g, __m512 u, float alpha, float limit) {
    const __m512 one = _mm512_set1_ps(1.0f), top = _mm512_set1_ps(limit);
    g = _mm512_min_ps(top, g);
    u = _mm512_max_ps(_mm512_set1_ps(-limit), _mm512_min_ps(top, u));
    const __m512 sig = _mm512_div_ps(one, _mm512_add_ps(one, em_exp16(_mm512_mul_ps(_mm512_set1_ps(-alpha), g))));
    return _mm512_mul_ps(_mm512_add_ps(u, one), _mm512_mul_ps(g, sig));
}

/* h of row pair i for 16 tokens from the tile's gate values g and up values u: the job's
 * biases (one a row, broadcast) added, then the call's GLU (em_glu_biased's arithmetic). */
static inline __m512 em_glu16(const em_call *c, const em_job *jb, int64_t i, __m512 g, __m512 u) {
    if (jb->gate_up_bias) {
        g = _mm512_add_ps(g, _mm512_set1_ps(em_bias_at(c, jb->gate_up_bias, i)));
        u = _mm512_add_ps(u, _mm512_set1_ps(em_bias_at(c, jb->gate_up_bias, c->I + i)));
    }
    return c->glu.act == EM_ACT_SILU ? em_swiglu16(g, u) : em_swiglu_oai16(g, u, c->glu.alpha, c->glu.limit);
}

/* Values i .. i+15 of the bias row at `addr` (lanes past m: zero) in fp32, exactly. */
static inline __m512 em_bias16(const em_call *c, int64_t addr, int64_t i, __mmask16 m) {
    if (!c->glu.bias_bf16) return _mm512_maskz_loadu_ps(m, (const float *)(intptr_t)addr + i);
    __m512i b = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)(intptr_t)addr + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(b, 16));
}

/* The valid token columns of the tile at t0: 32, or 16 at the end (np is a multiple of 16). */
static inline int em_tile_tokens(const em_jobstate *s, int t0) { return s->np - t0 >= 32 ? 32 : 16; }

/* h rows i0 .. i0+nv (i0 even) for the tokens [t0, t0 + nt) (nt 16 or 32: the tile's valid
 * columns): gate row r at tile[r * 32 + tt], up row r at tile[(up + r) * 32 + tt]. A row
 * without a partner (nv odd: the last row of an odd I) pairs with a zero written here: the
 * pair is this phase's alone (the pack leaves it, em_pack_token_pairs). */
static inline void em_put_h_rows(const em_call *c, const em_job *jb, const em_jobstate *s, int64_t i0, int nv, int t0,
                                 int nt, const float *tile, int up) {
    if (!EM_VEC_EPILOGUE) {
        for (int r = 0; r < nv + (nv & 1); r++) /* nv odd: the last pair's high half is zero, as below */
            for (int tt = 0; tt < nt; tt++)
                ((uint16_t *)s->hp)[(((i0 + r) >> 1) * s->np + t0 + tt) * 2 + ((i0 + r) & 1)] =
                    r < nv ? em_f32_to_bf16(em_glu(c, jb, i0 + r, tile[r * 32 + tt], tile[(up + r) * 32 + tt])) : 0;
        return;
    }
    const int plain = em_plain_glu(c, jb);
    for (int r = 0; r < nv; r += 2) {
        uint32_t *dst = s->hp + ((i0 + r) >> 1) * s->np + t0;
        for (int tt = 0; tt < nt; tt += 16) {
            const float *g = tile + r * 32 + tt, *u = tile + (up + r) * 32 + tt;
            __m512 g0 = _mm512_loadu_ps(g), u0 = _mm512_loadu_ps(u), h1 = _mm512_setzero_ps();
            __m512 h0 = plain ? em_swiglu16(g0, u0) : em_glu16(c, jb, i0 + r, g0, u0);
            if (r + 1 < nv) {
                __m512 g1 = _mm512_loadu_ps(g + 32), u1 = _mm512_loadu_ps(u + 32);
                h1 = plain ? em_swiglu16(g1, u1) : em_glu16(c, jb, i0 + r + 1, g1, u1);
            }
            __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(h0));
            __m512i hi = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(h1));
            _mm512_storeu_si512(dst + tt, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
    }
}

/* Output rows r0 .. r0+nr of the tokens [t0, t0 + nt) ∩ [0, n): out[orow][r0 + r] =
 * scale · (tile[r * 32 + tt] + b_d[r0 + r]) (em_store's arithmetic, the same bits; the
 * bias only where the job has one). */
static inline void em_store_rows(const em_call *c, const em_job *jb, const em_jobstate *s, const float *tile, int t0,
                                 int nt, int64_t r0, int nr) {
    if (!EM_VEC_EPILOGUE) {
        for (int tt = 0; tt < nt && t0 + tt < s->n; tt++)
            for (int r = 0; r < nr; r++) em_store(c, jb, t0 + tt, r0 + r, tile[r * 32 + tt]);
        return;
    }
    const __m512i column = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                              _mm512_set1_epi32(32));
    const int64_t bias = jb->down_bias;
    for (int tt = 0; tt < nt && t0 + tt < s->n; tt++) {
        const __m512 sc = _mm512_set1_ps(em_scale(jb, t0 + tt));
        float *o = em_out_row(c, jb, t0 + tt) + r0;
        for (int r = 0; r < nr; r += 16) {
            const __mmask16 m = nr - r >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (nr - r)) - 1u);
            __m512 v = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, column, tile + r * 32 + tt, 4);
            if (bias) v = _mm512_add_ps(v, em_bias16(c, bias, r0 + r, m));
            _mm512_mask_storeu_ps(o + r, m, _mm512_mul_ps(sc, v));
        }
    }
}

#endif
