// The σ-MoE paper ("Approximating Two-Layer Feedforward Networks for Efficient
// Transformers"), Tables 1–4 at small scale: a GPT-2 whose every MLP is, in turn, the
// dense MLP, the top-K activation MLP (Table 1), a parameter-matched product-key memory
// with softmax or ReLU scores (Table 2), σ-MoE (Table 3), and its ablations and the
// MoE baselines of Table 4 (standard dropout, softmax selection with and without
// renormalisation, standard init, no regularisation, K/G trade-offs, Switch Transformer,
// S-BASE). The paper trains 41M-262M models on
// WikiText-103, Enwik8, C4 and peS2o; here every model has gpt2-mini's shape (4 layers,
// 4 heads, width 256, context 128, d_ff = 1024) and trains on Moby-Dick characters, the
// character-level analog of its Enwik8 column, over several seeds; the paper's Enwik8
// bits per character stand beside our validation bits per character (loss / ln 2).
//
// Parameter-equal as the paper's: σ-MoE, Switch and S-BASE have N_E · G = d_ff; the PKM's
// 45² value rows (4 heads, 32 values each) about match the MLP's two matrices. % FLOPs is
// the MLP's multiply-adds per token relative to the dense MLP's 2 d d_ff: top-K,
// d d_ff + K d; the MoEs, d N_E (selection) + 2 K G d.
//
//   smoke: 2 layers of width 64, context 32, 10 steps, 2 seeds, five of the models (seconds)
//   local: 200 steps of 8 windows, 3 seeds, every model (15 minutes on 2 Zen 5 cores)
//   paper: WikiText-103 / Enwik8 at 41M-262M parameters: says what it needs and stops
//
//   repro_sigma_moe [--scale smoke|local|paper] [--out-dir DIR] [--seeds N] [--steps S]
//
// The corpus is tokenized once (prepare_text) into <out-dir>/data; runs go to
// <out-dir>/runs/<model>-seed<k>; a finished run is not run again.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "experiments/repro.h"
#include "mumoe.h"

using namespace mu;
using nlohmann::json;

namespace {

struct Model {
  std::string flag;                 // run directory name
  std::string name;                 // as the paper's tables call it
  std::string table;                // which of the paper's tables
  std::vector<std::string> args;    // train_gpt2 flags choosing the MLP
  double paper_bpc;                 // the paper's Enwik8 bits per character (NaN: not given)
  double flops_share;               // % of the dense MLP's FLOPs (NaN: not counted)
  bool smoke;                       // also run at the smoke scale
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"σ-MoE paper Tables 1-4 at small scale: dense, top-K, PKM, σ-MoE and its ablations, Switch, S-BASE"};
  repro::Common common;
  repro::add_common_flags(app, common, "repro_sigma_moe");
  int seeds = 0;
  int64_t steps = 0;
  app.add_option("--seeds", seeds, "Seeds per model (default: 2 at smoke, 3 at local)")->check(CLI::Range(1, 100));
  app.add_option("--steps", steps, "Optimizer steps per run at local scale (default 200)")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  if (common.scale == repro::Scale::Paper) {
    std::printf(
        "repro_sigma_moe --scale paper: the paper's settings are Transformer-XL models of 41M-262M parameters trained\n"
        "on WikiText-103, Enwik8, C4 and peS2o (its Tables 8-9), on GPUs. Needed and missing here: those corpora\n"
        "tokenized into token files (prepare_text --corpus file --input <text>) and a GPU.\n"
        "Nothing was run. The local scale runs the same comparison on Moby-Dick characters.\n");
    return 2;
  }

  try {
    const bool smoke = common.scale == repro::Scale::Smoke;
    if (seeds == 0) seeds = smoke ? 2 : 3;
    if (steps == 0) steps = smoke ? 10 : 200;
    const int64_t n_layer = smoke ? 2 : 4, n_head = 4, d = smoke ? 64 : 256, T = smoke ? 32 : 128, dff = 4 * d;
    const std::string bin = repro::program_dir();
    repro::make_dir(common.out_dir + "/runs");
    const std::string data = repro::prepared_corpus(common, "moby-dick", "char");

    auto s = [](int64_t v) { return std::to_string(v); };
    // MoE shares of the dense MLP's 2 d d_ff multiply-adds.
    auto moe_share = [&](int64_t ne, int64_t k, int64_t g) {
      return 100.0 * double(d * ne + 2 * k * g * d) / double(2 * d * dff);
    };
    const int64_t topk = dff / 16, g = dff / 16;  // K = d_ff / 16 units; G = d_ff / 16, N_E = 16
    // σ-MoE's own hyper-parameters, the paper's Enwik8 row of its Table 9: expert dropout
    // δ = 0.05 and entropy regularisation γ = 0.0001; each ablation changes one thing.
    auto sigma = [&](int64_t experts, int64_t size, int64_t k, std::vector<std::string> extra) {
      std::vector<std::string> a = {"--mlp", "sigma", "--experts", s(experts), "--expert-size", s(size), "--moe-k",
                                    s(k), "--expert-dropout", "0.05", "--entropy-weight", "0.0001"};
      // extra: (flag, value) pairs, each replacing the flag's value above or added after it.
      for (size_t i = 0; i + 1 < extra.size(); i += 2) {
        auto at = std::find(a.begin(), a.end(), extra[i]);
        if (at != a.end())
          *(at + 1) = extra[i + 1];
        else
          a.insert(a.end(), {extra[i], extra[i + 1]});
      }
      return a;
    };
    const std::vector<Model> all = {
        {"dense", "Dense", "1-4", {"--mlp", "dense"}, 1.08, 100.0, true},
        {"topk", "Top-K activation (K = " + s(topk) + ")", "1", {"--mlp", "topk", "--moe-k", s(topk)}, 1.07,
         100.0 * double(d * dff + topk * d) / double(2 * d * dff), true},
        {"pkm-softmax", "PKM, softmax", "2",
         {"--mlp", "pkm", "--pkm-subkeys", smoke ? "22" : "45", "--pkm-heads", "4", "--moe-k", smoke ? "8" : "32",
          "--pkm-activation", "softmax"},
         1.16, NAN, false},
        {"pkm-relu", "PKM, ReLU", "2",
         {"--mlp", "pkm", "--pkm-subkeys", smoke ? "22" : "45", "--pkm-heads", "4", "--moe-k", smoke ? "8" : "32",
          "--pkm-activation", "relu"},
         1.11, NAN, true},
        {"sigma", "σ-MoE (K = 4, G = " + s(g) + ")", "3-4", sigma(16, g, 4, {}), 1.08, moe_share(16, 4, g), true},
        {"sigma-stddrop", "  standard dropout", "4", sigma(16, g, 4, {"--expert-dropout", "0", "--hidden-dropout", "0.05"}),
         1.08, moe_share(16, 4, g), false},
        {"sigma-softmax", "  softmax (renorm.)", "4", sigma(16, g, 4, {"--selection", "softmax"}), 1.09,
         moe_share(16, 4, g), false},
        {"sigma-softmax-norenorm", "  softmax (no renorm.)", "4", sigma(16, g, 4, {"--selection", "softmax-norenorm"}),
         1.09, moe_share(16, 4, g), false},
        {"sigma-stdinit", "  standard init", "4", sigma(16, g, 4, {"--moe-init", "per-expert"}), 1.08,
         moe_share(16, 4, g), false},
        {"sigma-noreg", "  no regularization (γ = 0, δ = 0)", "4",
         sigma(16, g, 4, {"--entropy-weight", "0", "--expert-dropout", "0"}), 1.08, moe_share(16, 4, g), false},
        {"sigma-k8", "  K = 8, G = " + s(g / 2), "4", sigma(32, g / 2, 8, {}), 1.08, moe_share(32, 8, g / 2), false},
        {"sigma-k2", "  K = 2, G = " + s(2 * g), "4", sigma(8, 2 * g, 2, {}), 1.09, moe_share(8, 2, 2 * g), false},
        {"switch", "Switch Transformer (K = 1, G = " + s(4 * g) + ")", "4",
         {"--mlp", "switch", "--experts", "4", "--expert-size", s(4 * g), "--moe-k", "1"}, 1.08,
         moe_share(4, 1, 4 * g), true},
        {"sbase", "S-BASE (K = 4, G = " + s(g) + ")", "4",
         {"--mlp", "sbase", "--experts", "16", "--expert-size", s(g), "--moe-k", "4", "--entropy-weight", "0.0001"}, 1.17,
         moe_share(16, 4, g), false},
    };

    repro::Table t{std::string("σ-MoE Tables 1-4 analog (") + (smoke ? "smoke" : "local") +
                       " scale): Moby-Dick characters, validation bits per character, mean ± std over " +
                       std::to_string(seeds) + " seeds; the paper's Enwik8 beside",
                   {"MLP", "paper table", "params (ours)", "% FLOPs", "val bpc (ours)", "paper: Enwik8 bpc"},
                   {}};
    json rows = json::array();
    for (const Model& m : all) {
      if (smoke && !m.smoke) continue;
      std::vector<std::string> args = {bin + "/train_gpt2", "--data", data, "--max-steps", std::to_string(steps),
                                       "--n-layer", s(n_layer), "--n-head", s(n_head), "--n-embd", s(d),
                                       "--block-size", s(T), "--warmup", smoke ? "3" : "30", "--eval-every", "0",
                                       "--checkpoint-every", "0", "--sample-tokens", "0", "--no-progress"};
      args.insert(args.end(), m.args.begin(), m.args.end());
      const repro::Sweep sweep = repro::seed_sweep(common, m.flag, m.name, seeds, args, "val_loss");
      std::vector<double> bpc;
      for (double loss : sweep.values) bpc.push_back(loss / std::log(2.0));
      const repro::MeanStd st = repro::mean_std(bpc);
      const int64_t params = repro::logged_params(common.out_dir + "/runs/" + m.flag + "-seed0.log");
      char flops[32], paper[32];
      std::snprintf(flops, sizeof flops, std::isnan(m.flops_share) ? "n/a" : "%.1f%%", m.flops_share);
      std::snprintf(paper, sizeof paper, "%.2f", m.paper_bpc);
      t.rows.push_back({m.name, m.table, params > 0 ? repro::scaled(double(params), 2) : "?", flops, repro::pm(st, 3),
                        paper});
      rows.push_back({{"model", m.flag}, {"name", m.name}, {"params", params}, {"mean_bpc", st.mean},
                      {"std_bpc", st.std}, {"flops_share", std::isnan(m.flops_share) ? json(nullptr) : json(m.flops_share)},
                      {"paper_enwik8_bpc", m.paper_bpc}, {"runs", sweep.runs}});
    }
    std::printf("\n%s\n", t.markdown().c_str());
    repro::save_results(common, "sigma_moe.json",
                        {{"program", "repro_sigma_moe"}, {"scale", repro::scale_name(common.scale)}, {"seeds", seeds},
                         {"steps", steps}, {"d_model", d}, {"d_ff", dff}, {"rows", rows},
                         {"tables", json::array({t.to_json()})}});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "repro_sigma_moe: %s\n", e.what());
    return 1;
  }
  return 0;
}
