// Parameter and FLOP counts of μMoE layers and blocks, and the paper's printed counts:
// Table 10 (hierarchical CLIP final layers, 768 -> 1000 with bias, gating counted) and
// Table 4 (MLP parameters of GPT-2 124M and MLP-Mixer S-16 with μMoE blocks). Counts that
// cannot be allocated (dense MoE blocks) come from the shape-only static counts, which are
// checked against num_parameters() of real blocks first.
#include <cstdio>
#include <memory>
#include <string>

#include "experiments/mumoe_paper_configs.h"
#include "helpers.h"
#include "nn/mumoe_block.h"
#include "ops/einsum.h"

using namespace mu;
using nn::MoEKind;

namespace {

// n in units of 10^power with `decimals` decimals and a suffix, as the tables print it.
std::string rounded(int64_t n, double unit, int decimals, const char* suffix) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f%s", decimals, double(n) / unit, suffix);
  return buf;
}

struct Row {
  std::vector<int64_t> experts;
  int64_t params, params_one_level, params_regular_moe;
};

}  // namespace

// ---------------------------------------------------------------- static counts vs real modules

TEST_CASE("MuMoE::count_parameters equals num_parameters() of real blocks, every kind and option") {
  manual_seed(1);
  for (MoEKind kind : {MoEKind::CP, MoEKind::TR, MoEKind::TT, MoEKind::Tucker, MoEKind::Hadamard, MoEKind::Dense})
    for (const std::vector<int64_t>& experts : {std::vector<int64_t>{5}, {4, 3}, {2, 3, 2}})
      for (int64_t hidden : {0, 9})
        for (bool input_norm : {false, true})
          for (auto norm : {nn::GateNorm::None, nn::GateNorm::BatchNorm, nn::GateNorm::LayerNorm}) {
            nn::MuMoEOptions o(6, 7);
            o.experts(experts).kind(kind).hidden(hidden).input_norm(input_norm).gate_norm(norm).bias(hidden == 0);
            const size_t E = experts.size();
            if (kind == MoEKind::CP) o.rank(5);
            if (kind == MoEKind::TR) o.ranks(std::vector<int64_t>(E + 2, 3));
            if (kind == MoEKind::TT) o.rank(4);
            if (kind == MoEKind::Tucker) o.ranks(std::vector<int64_t>(E + 2, 2));
            nn::MuMoE block(o);
            INFO(block.extra_repr());
            CHECK(nn::MuMoE::count_parameters(o) == block.num_parameters());
          }
}

TEST_CASE("layer counts: the closed forms of each factorization") {
  nn::MoEShape s{10, 7, {3, 4}, true};  // 11 input rows
  CHECK(nn::CPMuMoE(s, 6).num_parameters() == 6 * (3 + 4 + 11 + 7));
  CHECK(nn::CPMuMoE::count_parameters(s, 6) == 6 * (3 + 4 + 11 + 7));
  // TR (R_1..R_4) = (2, 3, 4, 5): U_1 (2, 3, 3), U_2 (3, 4, 4), U_in (4, 11, 5), U_out (5, 7, 2).
  const int64_t tr = 2 * 3 * 3 + 3 * 4 * 4 + 4 * 11 * 5 + 5 * 7 * 2;
  CHECK(nn::TRMuMoE(s, {2, 3, 4, 5}).num_parameters() == tr);
  CHECK(nn::TRMuMoE::count_parameters(s, {2, 3, 4, 5}) == tr);
  CHECK(nn::TTMuMoE(s, {3, 4, 5}).num_parameters() == 1 * 3 * 3 + 3 * 4 * 4 + 4 * 11 * 5 + 5 * 7 * 1);
  // Tucker (R_N1, R_N2, R_I, R_O) = (2, 3, 4, 5): core 5·4·2·3 plus the four factors.
  const int64_t tk = 5 * 4 * 2 * 3 + 3 * 2 + 4 * 3 + 11 * 4 + 7 * 5;
  CHECK(nn::TuckerMuMoE(s, {2, 3, 4, 5}).num_parameters() == tk);
  CHECK(nn::TuckerMuMoE::count_parameters(s, {2, 3, 4, 5}) == tk);
  CHECK(nn::HadamardMoE(s).num_parameters() == (3 + 4 + 11) * 7);
  CHECK(nn::DenseMoE(s).num_parameters() == 3 * 4 * 11 * 7);
  CHECK(nn::DenseMoE::count_parameters(s) == 3 * 4 * 11 * 7);
}

TEST_CASE("FLOPs: the paper's per-token counts of the factorized and naive forward passes") {
  // One level, I + 1 = 769 rows, O = 768, N = 512: the setting of the paper's Table 8.
  nn::MoEShape s{768, 768, {512}, true};
  const int64_t I = 769, O = 768, N = 512;
  // CP: R(N + I + O) multiply-adds for the three factor products, plus R for the Hadamard product.
  nn::CPMuMoE cp(s, 512);
  CHECK(cp.flops_per_token() == 512 * (N + I + O) + 512);
  // TR: R1 N R2 + R2 I R3 + R1 R2 R3 + R1 O R3 (Section 3.2).
  nn::TRMuMoE tr(s, {4, 4, 128});
  CHECK(tr.flops_per_token() == 4 * N * 4 + 4 * I * 128 + 4 * 4 * 128 + 4 * O * 128);
  // The naive (dense) pass: N I O.
  CHECK(nn::DenseMoE::count_parameters(s) == N * I * O);
  CHECK(cp.flops(2048) == 2048 * cp.flops_per_token());
  // Hadamard: (Σ N_e + I) O products plus E·O for the elementwise ones.
  nn::HadamardMoE h({4, 3, {5, 2}, true});
  CHECK(h.flops_per_token() == (5 + 2 + 5) * 3 + 2 * 3);
  // Tucker: the projections, the core with the projected input, then with the projected
  // coefficients (R_O R_N: the preliminary paper's formula), the output.
  nn::TuckerMuMoE t({4, 3, {5}, true}, {2, 3, 4});
  CHECK(t.flops_per_token() == 5 * 2 + 5 * 3 + 4 * 3 * 2 + 4 * 2 + 3 * 4);
}

// The closed forms against the einsum planner's count (ops/einsum.h) of the very spec each
// layer's forward pass evaluates, for one input: two independent derivations.
TEST_CASE("FLOPs: every factorization's closed form equals the einsum planner's count of its forward spec") {
  manual_seed(3);
  for (const std::vector<int64_t>& experts : {std::vector<int64_t>{64}, {16, 4}}) {
    const nn::MoEShape s{48, 40, experts, true};
    const size_t E = experts.size();
    std::vector<std::shared_ptr<nn::MuMoELayer>> layers = {
        std::make_shared<nn::CPMuMoE>(s, 24),
        std::make_shared<nn::TRMuMoE>(s, std::vector<int64_t>(E + 2, 4)),
        std::make_shared<nn::TTMuMoE>(s, std::vector<int64_t>(E + 1, 6)),
        std::make_shared<nn::TuckerMuMoE>(s, std::vector<int64_t>(E + 2, 8)),
        std::make_shared<nn::HadamardMoE>(s)};
    for (const auto& layer : layers) {
      INFO(layer->extra_repr());
      std::string spec;
      std::vector<Shape> shapes;
      for (size_t e = 0; e < E; ++e) {
        spec += "b n" + std::to_string(e + 1) + ", ";
        shapes.push_back({1, experts[e]});
      }
      spec += "b i";
      shapes.push_back({1, 49});
      for (const auto& f : layer->factors()) {
        std::string t;
        for (const std::string& a : f.axes) t += (t.empty() ? "" : " ") + a;
        spec += ", " + t;
        shapes.push_back(f.param.shape());
      }
      const EinsumPath path = einsum_path(spec + " -> b o", shapes);
      // The planner's order is the cheapest (up to 12 operands), the closed form's one
      // order: the same count for one level; with two, Tucker's core is cheaper to
      // contract with the coefficients in another order than the closed form's.
      CHECK(path.exhaustive);
      if (E == 1) CHECK(double(layer->flops_per_token()) == path.flops);
      else CHECK(double(layer->flops_per_token()) >= path.flops);
    }
  }
}

TEST_CASE("FLOPs of a block: gating products plus every layer") {
  auto o = nn::MuMoEOptions(16, 8).hidden(32).experts({6, 2}).kind(MoEKind::CP).rank(10);
  nn::MuMoE block(o);
  CHECK(block.flops_per_token() ==
        16 * (6 + 2) + block.layer(0)->flops_per_token() + block.layer(1)->flops_per_token());
  CHECK(block.layer(0)->flops_per_token() == 10 * (6 + 2 + 17 + 32) + 2 * 10);
  CHECK(block.layer(1)->flops_per_token() == 10 * (6 + 2 + 33 + 8) + 2 * 10);
}

// ---------------------------------------------------------------- Table 10

TEST_CASE("Table 10 (a): hierarchical CPμMoE final layers, R = 512") {
  // experts per level; # params; # params with one level of as many experts; # params of a regular MoE.
  const Row rows[] = {
      {{128}, 1069568, 1069568, 98432000},
      {{128, 2}, 1072128, 1233408, 196864000},
      {{128, 2, 2}, 1074688, 1561088, 393728000},
      {{128, 2, 2, 2}, 1077248, 2216448, 787456000},
      {{128, 4}, 1074688, 1561088, 393728000},
      {{128, 4, 4}, 1079808, 3527168, 1574912000},
      {{128, 4, 4, 4}, 1084928, 11391488, 6299648000},
  };
  for (const Row& r : rows) {
    INFO("experts " << shape_str(r.experts));
    auto o = paper::clip_head(MoEKind::CP, r.experts);
    nn::MuMoE block(o);  // the real block: ~1M parameters
    CHECK(block.num_parameters() == r.params);
    CHECK(nn::MuMoE::count_parameters(o) == r.params);
    int64_t total = 1;
    for (int64_t n : r.experts) total *= n;
    CHECK(nn::MuMoE::count_parameters(paper::clip_head(MoEKind::CP, {total})) == r.params_one_level);
    // The regular MoE column counts the expert weights N (I + 1) O only, without gating.
    CHECK(nn::DenseMoE::count_parameters({768, 1000, r.experts, true}) == r.params_regular_moe);
  }
}

TEST_CASE("Table 10 (b): hierarchical TRμMoE final layers, ranks (4, ..., 4, 512)") {
  const Row rows[] = {
      {{128}, 3723264, 3723264, 98432000},
      {{128, 2}, 3724832, 3823616, 196864000},
      {{128, 2, 2}, 3726400, 4024320, 393728000},
      // The table prints 8,851,456 for one level of 1024 experts; the stated shapes give
      // 4·1024·4 + 4·769·512 + 512·1000·4 + 768·1024 = 4,425,728 (the printed value is twice that).
      {{128, 2, 2, 2}, 3727968, 4425728, 787456000},
      {{128, 4}, 3726400, 4024320, 393728000},
      {{128, 4, 4}, 3729536, 5228544, 1574912000},
      {{128, 4, 4, 4}, 3732672, 10045440, 6299648000},
  };
  for (const Row& r : rows) {
    INFO("experts " << shape_str(r.experts));
    auto o = paper::clip_head(MoEKind::TR, r.experts);
    CHECK(nn::MuMoE::count_parameters(o) == r.params);
    int64_t total = 1;
    for (int64_t n : r.experts) total *= n;
    CHECK(nn::MuMoE::count_parameters(paper::clip_head(MoEKind::TR, {total})) == r.params_one_level);
    CHECK(nn::DenseMoE::count_parameters({768, 1000, r.experts, true}) == r.params_regular_moe);
  }
  // Real blocks for the two rows the brief singles out (3.7M parameters each).
  nn::MuMoE one(paper::clip_head(MoEKind::TR, {128}));
  CHECK(one.num_parameters() == 3723264);
  nn::MuMoE two(paper::clip_head(MoEKind::TR, {128, 2}));
  CHECK(two.num_parameters() == 3724832);
  auto core = std::dynamic_pointer_cast<nn::TRMuMoE>(two.layer(0));
  REQUIRE(core != nullptr);
  CHECK(core->factors()[1].param.shape() == Shape{4, 2, 4});  // the extra level's core
}

// ---------------------------------------------------------------- Table 4

TEST_CASE("Table 4: GPT-2 124M MLP parameters with N = 256 (12 blocks, d = 768)") {
  // Each MLP d -> 4d -> d becomes two μMoE layers sharing coefficients, LN gating, input LN with affine.
  // One real block of each factorized kind, against the static count.
  for (MoEKind kind : {MoEKind::CP, MoEKind::TR}) {
    nn::MuMoE block(paper::gpt2_block(kind));
    CHECK(block.num_parameters() == nn::MuMoE::count_parameters(paper::gpt2_block(kind)));
  }
  const int64_t cp = 12 * nn::MuMoE::count_parameters(paper::gpt2_block(MoEKind::CP));
  const int64_t tr = 12 * nn::MuMoE::count_parameters(paper::gpt2_block(MoEKind::TR));
  const int64_t dense = 12 * nn::MuMoE::count_parameters(paper::gpt2_block(MoEKind::Dense));
  MESSAGE("GPT-2 N=256 MLP parameters: CP " << cp << ", TR " << tr << ", dense " << dense);
  CHECK(cp == 57048096);
  CHECK(tr == 57417696);
  CHECK(dense == 14509688832);
  CHECK(rounded(cp, 1e6, 1, "M") == "57.0M");
  CHECK(rounded(tr, 1e6, 1, "M") == "57.4M");
  CHECK(rounded(dense, 1e9, 1, "B") == "14.5B");
}

TEST_CASE("Table 4: MLP-Mixer S-16 MLP parameters with N = 64 (8 blocks, hidden 512, 196 tokens)") {
  // Token mixing 196 -> 256 -> 196 and channel mixing 512 -> 2048 -> 512, BN gating without affine.
  auto total = [&](MoEKind kind) {
    return 8 * (nn::MuMoE::count_parameters(paper::mixer_block(kind, 196, 256)) +
                nn::MuMoE::count_parameters(paper::mixer_block(kind, 512, 2048)));
  };
  for (MoEKind kind : {MoEKind::CP, MoEKind::TR}) {
    nn::MuMoE token(paper::mixer_block(kind, 196, 256)), channel(paper::mixer_block(kind, 512, 2048));
    CHECK(token.num_parameters() == nn::MuMoE::count_parameters(paper::mixer_block(kind, 196, 256)));
    CHECK(channel.num_parameters() == nn::MuMoE::count_parameters(paper::mixer_block(kind, 512, 2048)));
  }
  const int64_t cp = total(MoEKind::CP), tr = total(MoEKind::TR), dense = total(MoEKind::Dense);
  MESSAGE("Mixer S-16 N=64 MLP parameters: CP " << cp << ", TR " << tr << ", dense " << dense);
  CHECK(cp == 17706480);
  CHECK(tr == 17366656);
  CHECK(dense == 1127026688);
  CHECK(rounded(cp, 1e6, 1, "M") == "17.7M");
  CHECK(rounded(tr, 1e6, 1, "M") == "17.4M");
  CHECK(rounded(dense, 1e9, 2, "B") == "1.13B");
}
