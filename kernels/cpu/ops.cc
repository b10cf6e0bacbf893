#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "kernels/cpu/thread_pool.h"

namespace ring::cpu {

void RoundActInPlace(float* x, int64_t n, ActDType t) {
  if (t == ActDType::kF32) return;
  for (int64_t i = 0; i < n; ++i) x[i] = RoundAct(x[i], t);
}

void RmsNorm(const float* x, int64_t rows, int64_t dim, const TensorView& weight, float eps,
             ActDType t, float* out) {
  ParallelFor(rows, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * dim;
      float* o = out + r * dim;
      float ss = 0.f;
      for (int64_t i = 0; i < dim; ++i) ss += xr[i] * xr[i];
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
      for (int64_t i = 0; i < dim; ++i) {
        const float y = RoundAct(xr[i] * inv, t);
        o[i] = weight.present() ? RoundAct(y * weight.at(i), t) : y;
      }
    }
  });
}

void LayerNorm(const float* x, int64_t rows, int64_t dim, const TensorView& weight,
               const TensorView& bias, float eps, ActDType t, float* out) {
  ParallelFor(rows, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * dim;
      float* o = out + r * dim;
      float mean = 0.f;
      for (int64_t i = 0; i < dim; ++i) mean += xr[i];
      mean /= static_cast<float>(dim);
      float var = 0.f;
      for (int64_t i = 0; i < dim; ++i) var += (xr[i] - mean) * (xr[i] - mean);
      var /= static_cast<float>(dim);
      const float inv = 1.0f / std::sqrt(var + eps);
      for (int64_t i = 0; i < dim; ++i) {
        float y = RoundAct((xr[i] - mean) * inv, t);
        if (weight.present()) y = RoundAct(y * weight.at(i), t);
        if (bias.present()) y = RoundAct(y + bias.at(i), t);
        o[i] = y;
      }
    }
  });
}

void Rope(float* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t stride,
          int64_t dims, bool traditional, const std::vector<float>& inv_freq, int64_t offset,
          ActDType t) {
  const int64_t half = dims / 2;
  ParallelFor(tokens, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> cs(half), sn(half);
    for (int64_t tok = t0; tok < t1; ++tok) {
      const float pos = static_cast<float>(offset + tok);
      for (int64_t i = 0; i < half; ++i) {
        const float theta = pos * inv_freq[i];
        cs[i] = std::cos(theta);
        sn[i] = std::sin(theta);
      }
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x + tok * stride + h * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          const int64_t a = traditional ? 2 * i : i;
          const int64_t b = traditional ? 2 * i + 1 : i + half;
          const float x1 = v[a], x2 = v[b];
          v[a] = RoundAct(x1 * cs[i] - x2 * sn[i], t);
          v[b] = RoundAct(x1 * sn[i] + x2 * cs[i], t);
        }
      }
    }
  });
}

void Attention(const AttentionArgs& a, ActDType t, float* out) {
  const int64_t group = a.hq / a.hkv;
  ParallelFor(a.hq * a.L, 1, [&](int64_t w0, int64_t w1) {
    std::vector<float> q(a.dk), s(a.S), acc(a.dv);
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t h = w / a.L, i = w % a.L, kh = h / group;
      const float* qi = a.q + i * a.q_stride + h * a.dk;
      for (int64_t d = 0; d < a.dk; ++d) q[d] = qi[d] * a.scale;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < a.S; ++j) {
        if (a.causal_offset >= 0 && j > a.causal_offset + i) {
          s[j] = -std::numeric_limits<float>::infinity();
          continue;
        }
        const float* kj = a.k + j * a.k_stride + kh * a.dk;
        float dot = 0.f;
        for (int64_t d = 0; d < a.dk; ++d) dot += q[d] * kj[d];
        if (a.add_mask) dot += a.add_mask[(h * a.L + i) * a.S + j];
        s[j] = dot;
        mx = std::max(mx, dot);
      }
      float sum = 0.f;
      for (int64_t j = 0; j < a.S; ++j) {
        s[j] = std::isinf(s[j]) && s[j] < 0 ? 0.f : std::exp(s[j] - mx);
        sum += s[j];
      }
      const float inv = 1.f / sum;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j = 0; j < a.S; ++j) {
        const float p = s[j] * inv;
        if (p == 0.f) continue;
        const float* vj = a.v + j * a.v_stride + kh * a.dv;
        for (int64_t d = 0; d < a.dv; ++d) acc[d] += p * vj[d];
      }
      float* o = out + (i * a.hq + h) * a.dv;
      for (int64_t d = 0; d < a.dv; ++d) o[d] = RoundAct(acc[d], t);
    }
  });
}

void MatMulABt(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t m, int64_t n,
               int64_t k, float* c, int64_t ldc, ActDType t) {
  ParallelFor(m * n, 64, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t i = w / n, j = w % n;
      const float* ai = a + i * lda;
      const float* bj = b + j * ldb;
      float dot = 0.f;
      for (int64_t d = 0; d < k; ++d) dot += ai[d] * bj[d];
      c[i * ldc + j] = RoundAct(dot, t);
    }
  });
}

void SwiGlu(const float* gate, const float* up, int64_t n, ActDType t, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    // MLX's bf16 sigmoid rounds exp(-g) first (within 1 ulp of its own vector exp).
    const float sig = RoundAct(1.f / (1.f + RoundAct(std::exp(-g), t)), t);
    const float silu = RoundAct(g * sig, t);
    out[i] = RoundAct(silu * up[i], t);
  }
}

void Add(const float* a, const float* b, int64_t n, ActDType t, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = RoundAct(a[i] + b[i], t);
}

std::vector<int32_t> TopKIndices(const float* x, int64_t n, int64_t k) {
  k = std::min(k, n);
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  auto better = [&](int32_t p, int32_t q) {
    // NaN-free by construction (masked entries are -inf); higher value first, then index.
    return x[p] > x[q] || (x[p] == x[q] && p < q);
  };
  std::nth_element(idx.begin(), idx.begin() + (k > 0 ? k - 1 : 0), idx.end(), better);
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

int64_t ArgMax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

}  // namespace ring::cpu
