// One MoE decoder layer of moespec's verification pass in one native call: the library's own kernels composed
// in the order of a Llama-family pre-norm layer (OLMoE, Qwen3-MoE, Mixtral).
//
// Shape legend (every float array in one dtype, fp32 or bf16, unless said otherwise)
//   n tokens (1..16)   d hidden   Hq, Hkv heads   D head size   N experts   m experts per token   f expert width
//   h        [n, d]        the residual stream, updated in place
//   weights  q [Hq D, d], k and v [Hkv D, d], o [d, Hq D] (nn.Linear layout), biases or null; norms [d], q/k
//            norms [Hq D] and [Hkv D] ("full") or [D] ("head"); router [N, d]; gate_up [N, 2f, d]; down [N, d, f]
//   cos, sin [n, D]        the rotary rows of the pass's positions
//   keys, values           cache buffers [Hkv, capacity, D] with head and row strides; rows past .. past + n - 1
//                          are written, rows 0 .. past + n - 1 attended (the new tokens causally)
//   replay   [n, m] int64 or null: expert ids to use instead of the router's (its top-k weights kept, by rank)
// The layer computes, as transformers does:
//   x = rms(h); q, k, v = proj(x); q, k = qk_norm(q, k); clamp; rope(q, k); cache <- k, v
//   h = h + o_proj(attention(q, cache));  x = rms(h); ids, w = top-k(softmax(router x)); h = h + experts(x)
//
// Physics. The layer's bytes (its weights, its cached keys and values, the selected experts) are streamed by the
// kernels it calls, each the same code the Python path calls one by one. What one call saves is the Python and
// torch work between them: ~25 calls a layer, each tens of microseconds right after a stream has pushed megabytes
// through the caches, ~0.5 ms a layer on this project's machine. The results are those of the Python path bit
// for bit (moespec.model.lean runs one or the other).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "simd_common.h"

extern "C" {
int moespec_linear(int wdtype, int xdtype, int bdtype, int ydtype, int64_t n, int64_t K, int64_t M, const void* x,
                   int64_t ldx, const void* w, const void* bias, void* y, int64_t ldy, int nthreads, int isa);
int moespec_rms_norm(int dtype, int64_t rows, int64_t d, const void* x, int64_t x_s, const void* w, float eps,
                     void* y, int64_t y_s);
int moespec_rope(int dtype, int64_t n, int64_t H, int64_t D, void* t, int64_t t_sn, int64_t t_sh, const void* cos,
                 const void* sin);
int moespec_attention(int dtype, int64_t B, int64_t Hq, int64_t Hkv, int64_t n, int64_t L, int64_t D, int64_t Dv,
                      const void* q, int64_t q_sb, int64_t q_sh, int64_t q_sn, const void* k, int64_t k_sb,
                      int64_t k_sh, int64_t k_sl, const void* v, int64_t v_sb, int64_t v_sh, int64_t v_sl,
                      const uint8_t* mask, int64_t m_sb, int64_t m_si, int64_t m_sj, float scale, void* out,
                      int threads);
int moespec_softmax_topk(int ldtype, int64_t n, int64_t N, const void* logits, int64_t k, int renorm, int sdtype,
                         void* scores, int64_t* ids);
int moespec_expert_op(int wdtype, int xdtype, int rdtype, int mode, int act, float alpha, float limit, int64_t n,
                      int64_t m, int64_t N, int64_t d, int64_t f, const void* x, const int64_t* ids, const void* rw,
                      const void* gate_up, const void* down, const void* gate_up_bias, const void* down_bias,
                      void* out, int nthreads);
}

namespace {

using namespace moespec_simd;  // bf16, to_f32, to_bf16

// What the Python side fills in (moespec.kernels.layer.LayerArgs mirrors it field by field).
struct LayerArgs {
    int64_t dtype, n, d, Hq, Hkv, D, qk_norm;  // qk_norm: 0 none, 1 over the whole projection, 2 per head
    int64_t has_clip, N, m, f, renorm, scores_fp32, mode, past, threads;  // mode: 0 slot, 1 dedup, 2 no experts
    int64_t k_sh, k_sl, v_sh, v_sl;
    float eps, scale, clip, pad;
    void* h;
    const void *in_norm, *q_w, *k_w, *v_w, *o_w, *q_b, *k_b, *v_b, *o_b, *q_norm, *k_norm, *post_norm;
    const void *router_w, *gate_up, *down, *cos, *sin;
    void *keys, *values;
    const int64_t* replay;
};

template <typename T>
void add_into(T* h, const T* y, int64_t count) {  // h = round(h + y), as torch adds two tensors of T
    for (int64_t i = 0; i < count; ++i) {
        if constexpr (sizeof(T) == 4) h[i] = h[i] + y[i];
        else h[i] = to_bf16(to_f32(h[i]) + to_f32(y[i]));
    }
}

template <typename T>
void clamp(T* x, int64_t count, float c) {
    for (int64_t i = 0; i < count; ++i) {
        const float v = std::min(std::max(to_f32(x[i]), -c), c);
        if constexpr (sizeof(T) == 4) x[i] = v;
        else x[i] = to_bf16(v);
    }
}

template <typename T>
void copy_rows(const T* src, int64_t n, int64_t H, int64_t D, T* dst, int64_t sh, int64_t sl, int64_t past) {
    for (int64_t t = 0; t < n; ++t)  // src [n, H, D] -> dst[h, past + t, :]
        for (int64_t hh = 0; hh < H; ++hh)
            std::copy(src + (t * H + hh) * D, src + (t * H + hh + 1) * D, dst + hh * sh + (past + t) * sl);
}

template <typename T>
int layer(const LayerArgs& a) {
    const int dt = static_cast<int>(a.dtype), nt = static_cast<int>(a.threads);
    const int64_t n = a.n, d = a.d, qd = a.Hq * a.D, kd = a.Hkv * a.D;
    T* h = static_cast<T*>(a.h);
    std::vector<T> x(n * d), q(n * qd), k(n * kd), v(n * kd), o(n * qd), y(n * d);
    int rc = moespec_rms_norm(dt, n, d, h, d, a.in_norm, a.eps, x.data(), d);
    rc |= moespec_linear(dt, dt, dt, dt, n, d, qd, x.data(), d, a.q_w, a.q_b, q.data(), qd, nt, 0);
    rc |= moespec_linear(dt, dt, dt, dt, n, d, kd, x.data(), d, a.k_w, a.k_b, k.data(), kd, nt, 0);
    rc |= moespec_linear(dt, dt, dt, dt, n, d, kd, x.data(), d, a.v_w, a.v_b, v.data(), kd, nt, 0);
    if (a.qk_norm == 1) {
        rc |= moespec_rms_norm(dt, n, qd, q.data(), qd, a.q_norm, a.eps, q.data(), qd);
        rc |= moespec_rms_norm(dt, n, kd, k.data(), kd, a.k_norm, a.eps, k.data(), kd);
    }
    if (a.has_clip) {
        clamp(q.data(), n * qd, a.clip);
        clamp(k.data(), n * kd, a.clip);
        clamp(v.data(), n * kd, a.clip);
    }
    if (a.qk_norm == 2) {
        rc |= moespec_rms_norm(dt, n * a.Hq, a.D, q.data(), a.D, a.q_norm, a.eps, q.data(), a.D);
        rc |= moespec_rms_norm(dt, n * a.Hkv, a.D, k.data(), a.D, a.k_norm, a.eps, k.data(), a.D);
    }
    rc |= moespec_rope(dt, n, a.Hq, a.D, q.data(), qd, a.D, a.cos, a.sin);
    rc |= moespec_rope(dt, n, a.Hkv, a.D, k.data(), kd, a.D, a.cos, a.sin);
    if (rc) return 2;
    copy_rows(k.data(), n, a.Hkv, a.D, static_cast<T*>(a.keys), a.k_sh, a.k_sl, a.past);
    copy_rows(v.data(), n, a.Hkv, a.D, static_cast<T*>(a.values), a.v_sh, a.v_sl, a.past);
    rc |= moespec_attention(dt, 1, a.Hq, a.Hkv, n, a.past + n, a.D, a.D, q.data(), 0, a.D, qd, a.keys, 0, a.k_sh,
                            a.k_sl, a.values, 0, a.v_sh, a.v_sl, nullptr, 0, 0, 0, a.scale, o.data(), nt);
    rc |= moespec_linear(dt, dt, dt, dt, n, qd, d, o.data(), qd, a.o_w, a.o_b, y.data(), d, nt, 0);
    if (rc) return 2;
    add_into(h, y.data(), n * d);
    rc |= moespec_rms_norm(dt, n, d, h, d, a.post_norm, a.eps, x.data(), d);
    std::vector<T> logits(n * a.N);
    rc |= moespec_linear(dt, dt, dt, dt, n, d, a.N, x.data(), d, a.router_w, nullptr, logits.data(), a.N, nt, 0);
    const int sdt = a.scores_fp32 ? 0 : dt;
    std::vector<float> scores(n * a.m);  // fp32 room; bf16 scores use its first half
    std::vector<int64_t> ids(n * a.m);
    rc |= moespec_softmax_topk(dt, n, a.N, logits.data(), a.m, static_cast<int>(a.renorm), sdt, scores.data(),
                               ids.data());
    if (rc) return 2;
    if (a.mode == 2) return 0;  // the expert operation taken out (the router still runs): the MoE layer adds nothing
    const int64_t* chosen = a.replay ? a.replay : ids.data();
    if (moespec_expert_op(dt, dt, sdt, static_cast<int>(a.mode), 0, 0.0f, 0.0f, n, a.m, a.N, d, a.f, x.data(),
                          chosen, scores.data(), a.gate_up, a.down, nullptr, nullptr, y.data(), nt))
        return 3;
    add_into(h, y.data(), n * d);
    return 0;
}

}  // namespace

extern "C" {

// The ABI of this file and of LayerArgs; moespec.kernels.native checks it after loading.
int moespec_layer_abi_version() { return 1; }

// `count` consecutive layers, args[0] first, on one residual stream (each args[i].h the same): a pass's layers
// in one call, so the Python work of a pass is done before its streams start. Returns 0; 1 on a bad dtype, mode
// or size; 2 when a kernel refused its arguments; 3 on an expert id outside [0, N) (replayed ids); the layers
// before the failing one have run.
int moespec_decoder_layers(const LayerArgs* args, int64_t count) {
    if (!args || count < 1) return 1;
    for (int64_t i = 0; i < count; ++i) {
        const LayerArgs* a = args + i;
        if ((a->dtype != 0 && a->dtype != 1) || a->mode < 0 || a->mode > 2 || a->n < 1 || a->n > 16) return 1;
        if (a->qk_norm < 0 || a->qk_norm > 2 || a->Hkv < 1 || a->Hq % a->Hkv || a->D % 2 || a->m < 1 || a->m > a->N)
            return 1;
        const int rc = a->dtype == 0 ? layer<float>(*a) : layer<bf16>(*a);
        if (rc) return rc;
    }
    return 0;
}

}  // extern "C"
