// The μMoE blocks of the paper's parameter tables, as nn::MuMoEOptions: shared by
// experiments/repro_param_counts.cpp (which prints the tables) and
// tests/test_mumoe_counts.cpp (which checks the counts against the printed numbers).
#pragma once
#include <cstdint>
#include <vector>

#include "nn/mumoe_block.h"

namespace mu::paper {

// Table 4, GPT-2 124M: each MLP d -> 4d -> d (d = 768) as two μMoE layers sharing the
// coefficients, N = 256, LN gating, input LayerNorm with affine; ranks int(0.725 d) = 556
// (CP) and (4, 4, int(0.195 d)) = (4, 4, 149) (TR).
inline nn::MuMoEOptions gpt2_block(nn::MoEKind kind) {
  nn::MuMoEOptions o(768, 768);
  o.hidden(3072).experts({256}).kind(kind).gate_norm(nn::GateNorm::LayerNorm).input_norm(true);
  if (kind == nn::MoEKind::CP) o.rank(int64_t(0.725 * 768));
  if (kind == nn::MoEKind::TR) o.ranks({4, 4, int64_t(0.195 * 768)});
  return o;
}

// Table 4, MLP-Mixer S-16: a mixing block d -> hidden -> d (token 196 -> 256, channel
// 512 -> 2048), N = 64, BN gating without affine; ranks int(0.75 d) (CP) and
// (4, 4, int(0.19 d)) (TR).
inline nn::MuMoEOptions mixer_block(nn::MoEKind kind, int64_t d, int64_t hidden) {
  nn::MuMoEOptions o(d, d);
  o.hidden(hidden).experts({64}).kind(kind).gate_norm(nn::GateNorm::BatchNorm);
  if (kind == nn::MoEKind::CP) o.rank(int64_t(0.75 * double(d)));
  if (kind == nn::MoEKind::TR) o.ranks({4, 4, int64_t(0.19 * double(d))});
  return o;
}

// Table 10: a CLIP final layer 768 -> 1000 with bias and BN gating, one level per entry
// of `experts`; CP R = 512; TR ranks R_1 = R_2 = 4 around the first level, each further
// level's trailing rank `extra_rank` (0: that level's expert count, as the table's
// caption words it; the printed counts use 4), and 512 last.
inline nn::MuMoEOptions clip_head(nn::MoEKind kind, const std::vector<int64_t>& experts, int64_t extra_rank = 4) {
  nn::MuMoEOptions o(768, 1000);
  o.experts(experts).kind(kind).gate_norm(nn::GateNorm::BatchNorm);
  if (kind == nn::MoEKind::CP) o.rank(512);
  if (kind == nn::MoEKind::TR) {
    std::vector<int64_t> r{4, 4};
    for (size_t e = 1; e < experts.size(); ++e) r.push_back(extra_rank > 0 ? extra_rank : experts[e]);
    r.push_back(512);
    o.ranks(r);
  }
  return o;
}

}  // namespace mu::paper
