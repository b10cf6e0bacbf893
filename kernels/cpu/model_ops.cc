#include "kernels/cpu/model_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/thread_pool.h"

namespace ring::cpu {
namespace {
constexpr float kBf16Lowest = -3.3895313892515355e38f;  // finfo(bfloat16).min
}  // namespace

void MlaAttention(const MlaAttentionArgs& a, const QuantWeight& embed_q,
                  const QuantWeight& unembed_out, ActDType t, float* out) {
  const int64_t T = a.T, H = a.H, nope = a.nope, rope = a.rope, vd = a.vd, kvl = a.kvl;
  const int64_t qd = nope + rope, S = a.S, offset = a.offset;
  const bool sparse = a.topk != nullptr;
  const int64_t K = sparse ? a.K : 0;
  const int32_t* topk = a.topk;

  // Keys visible to each query: decode with top-k gathers K cached rows; otherwise all S.
  const bool gather = sparse && T == 1;
  const int64_t Sk = gather ? K : S;
  std::vector<float> glat, gpe;
  const float* lat = a.latent;
  const float* pe = a.k_pe;
  if (gather) {
    glat.resize(K * kvl);
    gpe.resize(K * rope);
    for (int64_t j = 0; j < K; ++j) {
      std::copy_n(a.latent + topk[j] * kvl, kvl, glat.data() + j * kvl);
      std::copy_n(a.k_pe + topk[j] * rope, rope, gpe.data() + j * rope);
    }
    lat = glat.data();
    pe = gpe.data();
  }
  // pe_scores[h][i][j] = round(round(q_pe * scale) . k_pe_j), masked to bf16's lowest.
  std::vector<float> qpe(T * H * rope);
  for (int64_t r = 0; r < T; ++r)
    for (int64_t hh = 0; hh < H; ++hh)
      for (int64_t d = 0; d < rope; ++d)
        qpe[(r * H + hh) * rope + d] = RoundAct(a.q[(r * H + hh) * qd + nope + d] * a.scale, t);
  std::vector<float> pe_scores(H * T * Sk);
  std::vector<uint8_t> allowed;
  if (T > 1) {
    allowed.assign(T * Sk, 0);
    for (int64_t i = 0; i < T; ++i) {
      if (sparse) {
        for (int64_t s = 0; s < K; ++s) allowed[i * Sk + topk[i * K + s]] = 1;
      } else {
        std::fill_n(allowed.begin() + i * Sk, Sk, 1);
      }
      for (int64_t j = offset + i + 1; j < Sk; ++j) allowed[i * Sk + j] = 0;
    }
  }
  ParallelFor(H, 1, [&](int64_t h0, int64_t h1) {
    for (int64_t hh = h0; hh < h1; ++hh) {
      float* ps = pe_scores.data() + hh * T * Sk;
      MatMulABt(qpe.data() + hh * rope, H * rope, pe, rope, T, Sk, rope, ps, Sk, t);
      if (!allowed.empty()) {
        for (int64_t i = 0; i < T * Sk; ++i)
          if (!allowed[i]) ps[i] = kBf16Lowest;
      }
    }
  });
  std::vector<float> qn(T * H * nope);
  for (int64_t r = 0; r < T; ++r)
    for (int64_t hh = 0; hh < H; ++hh)
      std::copy_n(a.q + (r * H + hh) * qd, nope, qn.data() + (r * H + hh) * nope);

  if (T > 1) {
    // Expanded form: per-head keys latent @ W_UK and values latent @ W_UV^T.
    std::vector<float> kexp(Sk * H * nope), vexp(Sk * H * vd);
    ParallelFor(H, 1, [&](int64_t h0, int64_t h1) {
      std::vector<float> kb(Sk * nope), vb(Sk * vd);
      for (int64_t hh = h0; hh < h1; ++hh) {
        QMatmulN(lat, Sk, embed_q, hh, kb.data());
        QMatmulT(lat, Sk, unembed_out, hh, vb.data());
        for (int64_t j = 0; j < Sk; ++j) {
          for (int64_t d = 0; d < nope; ++d)
            kexp[(j * H + hh) * nope + d] = RoundAct(kb[j * nope + d], t);
          for (int64_t d = 0; d < vd; ++d)
            vexp[(j * H + hh) * vd + d] = RoundAct(vb[j * vd + d], t);
        }
      }
    });
    AttentionArgs args{qn.data(), H * nope, kexp.data(), H * nope, vexp.data(), H * vd,
                       T, Sk, H, H, nope, vd, a.scale, pe_scores.data(), -1};
    Attention(args, t, out);
  } else {
    // Absorbed form: queries move into the latent space, K = V = latent (one KV head).
    std::vector<float> qlat(H * kvl), olat(H * kvl);
    for (int64_t hh = 0; hh < H; ++hh) {
      QMatmulT(qn.data() + hh * nope, 1, embed_q, hh, qlat.data() + hh * kvl);
    }
    RoundActInPlace(qlat.data(), qlat.size(), t);
    AttentionArgs args{qlat.data(), H * kvl, lat, kvl, lat, kvl,
                       1, Sk, H, 1, kvl, kvl, a.scale, pe_scores.data(), -1};
    Attention(args, t, olat.data());
    for (int64_t hh = 0; hh < H; ++hh) {
      QMatmulT(olat.data() + hh * kvl, 1, unembed_out, hh, out + hh * vd);
    }
    RoundActInPlace(out, H * vd, t);
  }
}

void IndexerTopK(const IndexerArgs& a, ActDType t, int32_t* topk) {
  const int64_t T = a.T, S = a.S, ih = a.heads, id = a.dim, K = a.K;
  ParallelFor(T, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> tot(S);
    for (int64_t r = t0; r < t1; ++r) {
      for (int64_t hh = 0; hh < ih; ++hh) {
        const float* qh = a.q + (r * ih + hh) * id;
        for (int64_t j = 0; j < S; ++j) {
          const float* kj = a.keys + j * id;
          float dot = 0.f;
          for (int64_t d = 0; d < id; ++d) dot += qh[d] * kj[d];
          dot = std::max(RoundAct(dot, t), 0.f);
          const float sc = RoundAct(dot * a.w[r * ih + hh], t);
          // mlx-lm sums heads one at a time in bf16 for s > 1 and with mx.sum (fp32
          // accumulation, one rounding) for s == 1.
          if (T > 1) {
            tot[j] = hh == 0 ? sc : RoundAct(tot[j] + sc, t);
          } else {
            tot[j] = hh == 0 ? sc : tot[j] + sc;
          }
        }
      }
      if (T == 1) {
        for (int64_t j = 0; j < S; ++j) tot[j] = RoundAct(tot[j], t);
      } else {
        for (int64_t j = a.offset + r + 1; j < S; ++j)
          tot[j] = -std::numeric_limits<float>::infinity();
      }
      const std::vector<int32_t> sel = TopKIndices(tot.data(), S, K);
      std::copy(sel.begin(), sel.end(), topk + r * K);
    }
  });
}

void RouteSigmoid(const float* logits, const float* bias, int64_t T, const SigmoidRouting& c,
                  int32_t* ids_out, float* weights) {
  const int64_t E = c.E, K = c.k;
  ParallelFor(T, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> s(E), sel(E);
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t e = 0; e < E; ++e) {
        s[e] = 1.f / (1.f + std::exp(-logits[r * E + e]));
        sel[e] = s[e] + bias[e];
      }
      if (c.n_group > 1) {
        // Group score = sum of its two best experts; the n_group - topk_group weakest
        // groups are zeroed (set to 0.0, as mlx-lm does, not -inf).
        const int64_t gs = E / c.n_group;
        std::vector<float> gscore(c.n_group);
        for (int64_t g = 0; g < c.n_group; ++g) {
          const std::vector<int32_t> top2 = TopKIndices(sel.data() + g * gs, gs, 2);
          gscore[g] = 0.f;
          for (int32_t i : top2) gscore[g] += sel[g * gs + i];
        }
        std::vector<float> neg(c.n_group);
        for (int64_t g = 0; g < c.n_group; ++g) neg[g] = -gscore[g];
        for (int32_t g : TopKIndices(neg.data(), c.n_group, c.n_group - c.topk_group))
          std::fill_n(sel.begin() + g * gs, gs, 0.f);
      }
      const std::vector<int32_t> ids = TopKIndices(sel.data(), E, K);
      float* wts = weights + r * K;
      float denom = 0.f;
      for (int64_t k = 0; k < K; ++k) denom += (wts[k] = s[ids[k]]);
      for (int64_t k = 0; k < K; ++k) {
        if (K > 1 && c.norm_topk_prob) wts[k] /= denom;
        wts[k] *= c.routed_scaling_factor;
        ids_out[r * K + k] = ids[k];
      }
    }
  });
}

void RouteSoftmax(const float* gates, int64_t T, int64_t E, int64_t K, bool norm_topk_prob,
                  ActDType t, int32_t* ids_out, float* scores) {
  ParallelFor(T, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> p(E);
    for (int64_t r = r0; r < r1; ++r) {
      // softmax(precise=True): fp32 inside, the probabilities stored in the act dtype.
      const float* g = gates + r * E;
      float mx = g[0];
      for (int64_t e = 1; e < E; ++e) mx = std::max(mx, g[e]);
      float sum = 0.f;
      for (int64_t e = 0; e < E; ++e) sum += (p[e] = std::exp(g[e] - mx));
      for (int64_t e = 0; e < E; ++e) p[e] = RoundAct(p[e] / sum, t);
      const std::vector<int32_t> ids = TopKIndices(p.data(), E, K);
      float* sc = scores + r * K;
      float denom = 0.f;
      for (int64_t k = 0; k < K; ++k) denom += (sc[k] = p[ids[k]]);
      if (norm_topk_prob) {
        denom = RoundAct(denom, t);
        for (int64_t k = 0; k < K; ++k) sc[k] = RoundAct(sc[k] / denom, t);
      }
      for (int64_t k = 0; k < K; ++k) ids_out[r * K + k] = ids[k];
    }
  });
}

void ExpertsSwiGlu(const QuantWeight& gate, const QuantWeight& up, const QuantWeight& down,
                   const float* x, int64_t T, const int32_t* ids, int64_t k, ActDType t,
                   float* y) {
  const int64_t inter = gate.rows(), hidden = down.rows();
  ParallelFor(T, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> g(inter), u(inter);
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t s = 0; s < k; ++s) {
        const int32_t e = ids[r * k + s];
        QMatmulT(x + r * hidden, 1, up, e, u.data());
        QMatmulT(x + r * hidden, 1, gate, e, g.data());
        RoundActInPlace(u.data(), inter, t);
        RoundActInPlace(g.data(), inter, t);
        SwiGlu(g.data(), u.data(), inter, t, g.data());
        float* o = y + (r * k + s) * hidden;
        QMatmulT(g.data(), 1, down, e, o);
        RoundActInPlace(o, hidden, t);
      }
    }
  });
}

void MoeCombine(const float* y, const float* w, const float* shared, int64_t T, int64_t k,
                int64_t hidden, CombineMode mode, ActDType t, float* out) {
  ParallelFor(T, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* yr = y + r * k * hidden;
      const float* wr = w + r * k;
      for (int64_t d = 0; d < hidden; ++d) {
        float acc = 0.f;
        if (mode == CombineMode::kFp32Sum) {
          for (int64_t s = 0; s < k; ++s) acc += yr[s * hidden + d] * wr[s];
        } else {
          for (int64_t s = 0; s < k; ++s) acc += RoundAct(yr[s * hidden + d] * wr[s], t);
        }
        float v = RoundAct(acc, t);
        if (shared != nullptr) v = RoundAct(v + shared[r * hidden + d], t);
        out[r * hidden + d] = v;
      }
    }
  });
}

}  // namespace ring::cpu
