// Trains a GPT-2 (dense, CPμMoE or TRμMoE MLPs) on token files made by prepare_text
// (train.bin, val.bin, meta.json in --data), then prints a sample from generate().
//
//   ./build/experiments/prepare_text --corpus moby-dick --tokenizer gpt2 --out data/moby
//   ./build/experiments/train_gpt2 --data data/moby --out-dir runs/moby --max-steps 600
//   ./build/experiments/train_gpt2 --data data/moby --out-dir runs/moby --max-steps 1200 --resume
//
// The model is gpt2-mini (4 layers, 4 heads, width 256, context 128) unless the size
// flags say otherwise; the vocabulary is the data's. Every step's windows are drawn from
// a generator seeded by (--seed, micro-batch number), so --resume continues bit-identically.
// Ctrl-C saves a checkpoint and exits with status 130.
//
// Under `mpirun -np N` the same command trains data-parallel (experiments/train_dist.h):
// each rank takes its N-th of every micro-batch's windows, only rank 0 prints and writes.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "data/gpt2_tokenizer.h"
#include "data/text_meta.h"
#include "data/token_file.h"
#include "models/gpt2.h"
#include "nn/pkm.h"
#include "nn/sparse_moe.h"
#include "mumoe.h"
#include "optim/adamw.h"
#include "optim/decay_groups.h"
#include "train_dist.h"
#include "train_flags.h"
#include "train_seed.h"

using namespace mu;
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  CLI::App app{"Train a GPT-2 (MLP: dense, CPμMoE, TRμMoE, or a sparse MLP of the σ-MoE paper) on token files from prepare_text."};
  experiments::TrainFlags f;
  f.batch_size = 8;
  f.lr = 1e-3;
  f.min_lr = 1e-4;
  f.warmup = 50;
  f.eval_every = 100;
  f.checkpoint_every = 200;
  experiments::add_train_flags(app, f, {"dense", "cp", "tr", "topk", "pkm", "sigma", "switch", "sbase"});
  std::string data_dir;
  int64_t n_layer = 4, n_head = 4, n_embd = 256, block_size = 128, eval_batches = 8, sample_tokens = 200, top_k = 40;
  int64_t rank = 0;
  double dropout = 0.0, temperature = 0.8, expect_drop = 0;
  bool chunked_loss = false, gelu_recompute = false;
  app.add_option("--data", data_dir, "Directory with train.bin, val.bin and meta.json (from prepare_text)")->required();
  app.add_option("--n-layer", n_layer, "Transformer blocks")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--n-head", n_head, "Attention heads")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--n-embd", n_embd, "Width (a multiple of --n-head)")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--block-size", block_size, "Context length T of the training windows")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--rank", rank, "CP rank, or TR last rank, of the μMoE MLPs (0: the paper's rule, for 64 or 256 "
                 "experts)")->capture_default_str()->check(CLI::NonNegativeNumber);
  // The sparse MLPs of the σ-MoE paper (models/gpt2.h, nn/sparse_moe.h, nn/pkm.h, nn/topk_mlp.h).
  int64_t moe_k = 4, expert_size = 64, pkm_heads = 4, pkm_sub = 32;
  double expert_dropout = 0.0, hidden_dropout = 0.0, entropy_weight = 0.001;
  std::string pkm_activation = "relu", selection = "sigmoid", moe_init = "dense";
  app.add_option("--moe-k", moe_k, "Units (topk), values per head (pkm) or experts (sigma, switch, sbase) kept per "
                 "token")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--expert-size", expert_size, "Width G of each expert (sigma, switch, sbase); --experts of them")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--pkm-heads", pkm_heads, "Heads of the product-key memory")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--pkm-subkeys", pkm_sub, "Sub-keys per half of the product-key memory (n_sub² values)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--pkm-activation", pkm_activation, "Activation of the product-key memory's scores")
      ->capture_default_str()->check(CLI::IsMember({"relu", "softmax"}));
  app.add_option("--selection", selection, "Expert selection of --mlp sigma: sigmoid (σ-MoE), softmax (renormalised "
                 "over the K chosen) or softmax-norenorm (the softmax over all experts; the σ-MoE paper's two softmax "
                 "ablations)")->capture_default_str()
      ->check(CLI::IsMember({"sigmoid", "softmax", "softmax-norenorm"}));
  app.add_option("--expert-dropout", expert_dropout, "Expert dropout of --mlp sigma")->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--hidden-dropout", hidden_dropout, "Standard dropout on the experts' hidden units of --mlp sigma, "
                 "switch, sbase (the σ-MoE paper's 'standard dropout' ablation)")->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--entropy-weight", entropy_weight, "Entropy regularisation weight of --mlp sigma (0: none)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--moe-init", moe_init, "Expert initialisation of the sparse MoEs: dense (as the dense MLP they "
                 "replace) or per-expert (the σ-MoE paper's 'standard init' ablation)")->capture_default_str()
      ->check(CLI::IsMember({"dense", "per-expert"}));
  app.add_option("--dropout", dropout, "Dropout of embeddings, attention, residuals and MLPs")->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--eval-batches", eval_batches, "Validation batches (of --batch-size windows) per evaluation")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--sample-tokens", sample_tokens, "Tokens generate() prints after training (0: none)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--temperature", temperature, "Sampling temperature")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--top-k", top_k, "Sample among the k likeliest tokens (0: all)")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--chunked-loss", chunked_loss, "Take the lm_head and the loss a chunk of positions at a time, never "
               "holding the (batch x context x vocabulary) logits (linear_cross_entropy: less memory, the same steps)");
  app.add_flag("--gelu-recompute", gelu_recompute, "The dense MLPs keep c_fc's output and compute the GELU again in "
               "the backward pass (llm.c's recompute: one (batch x context x 4 n_embd) activation less per block, "
               "the same steps); --mlp dense only");
  app.add_option("--expect-drop", expect_drop, "Exit with status 3 unless the validation loss falls by at least this "
                 "many nats from its value before training (a check for tests; not with --resume)")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    // Before the data loads. The library's message names its API; here the flags are what
    // the user can change.
    MU_CHECK(!(f.mlp == "cp" || f.mlp == "tr") || rank > 0 || f.experts == 64 || f.experts == 256, "--rank 0 takes ",
             "the paper's rule, which is defined for --experts 64 or 256 only; got --experts ", f.experts,
             ": pass the ", f.mlp == "cp" ? "CP rank" : "TR last rank", " with --rank");
    MU_CHECK(!gelu_recompute || f.mlp == "dense", "--gelu-recompute applies to --mlp dense only, got --mlp ", f.mlp);
    const data::TextMeta meta = data::load_text_meta((fs::path(data_dir) / "meta.json").string());
    const data::TokenFileOptions file_opts = data::TokenFileOptions().vocab_size(meta.vocab_size);
    const data::TokenFile train_file((fs::path(data_dir) / "train.bin").string(), file_opts);
    const data::TokenFile val_file((fs::path(data_dir) / "val.bin").string(), file_opts);

    models::GPT2Config cfg;
    cfg.n_layer = n_layer;
    cfg.n_head = n_head;
    cfg.n_embd = n_embd;
    cfg.block_size = block_size;
    cfg.vocab_size = meta.vocab_size;
    cfg.dropout = dropout;
    cfg.recompute = f.recompute;
    cfg.chunked_loss = chunked_loss;
    cfg.gelu_recompute = gelu_recompute;
    if (f.mlp == "cp") cfg.mlp = models::mlp::cp_mumoe(f.experts, rank);
    if (f.mlp == "tr") cfg.mlp = models::mlp::tr_mumoe(f.experts, rank);
    if (f.mlp == "topk") cfg.mlp = models::mlp::topk_mlp(moe_k);
    if (f.mlp == "pkm")
      cfg.mlp = models::mlp::pkm(pkm_sub, pkm_heads, moe_k,
                                 pkm_activation == "relu" ? nn::PKMActivation::ReLU : nn::PKMActivation::Softmax);
    const nn::ExpertInit init = moe_init == "dense" ? nn::ExpertInit::Dense : nn::ExpertInit::PerExpert;
    if (f.mlp == "sigma")
      cfg.mlp = models::mlp::sparse_moe(
          "sigma_moe-" + selection + "-" + moe_init, [=, experts = f.experts](const models::GPT2Config& c) {
            nn::SparseMoEOptions o = nn::sigma_moe_options(c.n_embd, experts, expert_size, moe_k, expert_dropout,
                                                           entropy_weight);
            if (selection == "softmax") o.selection(nn::Selection::SoftmaxRenorm);
            if (selection == "softmax-norenorm") o.selection(nn::Selection::Softmax);
            return o.init(init).hidden_dropout(hidden_dropout);
          });
    // Switch Transformer: softmax top-K (K = 1 in its paper) with its load-balancing loss;
    // S-BASE: Sinkhorn-balanced assignment in training, sigmoid weights.
    if (f.mlp == "switch" || f.mlp == "sbase")
      cfg.mlp = models::mlp::sparse_moe(f.mlp, [=, experts = f.experts, kind = f.mlp](const models::GPT2Config& c) {
        return nn::SparseMoEOptions(c.n_embd, experts, expert_size)
            .k(moe_k)
            .selection(kind == "switch" ? nn::Selection::Switch : nn::Selection::SBase)
            .hidden_dropout(hidden_dropout)
            .init(init);
      });
    experiments::DataParallel dp;
    manual_seed(f.seed);
    auto model = std::make_shared<models::GPT2>(cfg);
    const Device dev = dp.device(f);
    model->to(dev);
    const bool bf16 = f.dtype == "bf16";
    if (dp.main) std::fprintf(stderr, "GPT-2 %lld layers, %lld heads, width %lld, context %lld, vocab %lld, MLP %s: %lld parameters\n",
                 (long long)n_layer, (long long)n_head, (long long)n_embd, (long long)block_size,
                 (long long)cfg.vocab_size, cfg.mlp.name.c_str(), (long long)model->num_parameters());
    if (dp.main) std::fprintf(stderr, "device %s, %s\n", dev.str().c_str(), bf16 ? "bf16 autocast" : "fp32");
    if (dp.main) std::fprintf(stderr, "data %s (%s tokenizer): %lld train, %lld validation tokens\n", data_dir.c_str(),
                 meta.tokenizer.c_str(), (long long)train_file.size(), (long long)val_file.size());

    // nanoGPT: weight matrices and embeddings decay, biases and norm gains do not.
    optim::AdamW opt(optim::decay_groups(*model, f.weight_decay),
                     optim::AdamWOptions(f.lr).betas(f.beta1, f.beta2).weight_decay(f.weight_decay));
    const int64_t decay_end = std::max<int64_t>(f.max_steps, f.warmup + 1);
    auto schedule = optim::warmup_cosine_lr(f.lr, std::min(f.min_lr, f.lr), f.warmup, decay_end);

    const int64_t B = f.batch_size, T = block_size;
    const int64_t windows = data::eval_window_count(val_file, T);
    MU_CHECK(windows > 0, "val.bin holds ", val_file.size(), " tokens, too few for one window of ", T + 1);
    train::LoopOptions o = experiments::loop_options(f);
    o.units_per_step = B * T * f.grad_accum;
    o.unit = "tok";
    dp.attach(*model, opt, f, o);
    // The global micro-batch's windows are drawn as one process draws them; this rank
    // takes its rows.
    const dist::Shard shard = dp.shard(B);
    train::LoopHooks h;
    h.micro_batch_loss = [&](int64_t step, int64_t micro) {
      Generator g(experiments::mix_seed(f.seed, uint64_t(step * f.grad_accum + micro)));
      data::TokenBatch b = data::random_windows(train_file, B, T, &g);
      if (shard.count != B) b = {b.x.narrow(0, shard.begin, shard.count), b.y.narrow(0, shard.begin, shard.count)};
      AutocastGuard amp(kBFloat16, bf16);
      return model->forward(b.x.to(dev), b.y.to(dev)).loss;
    };
    // The same validation windows every time: the first eval_batches * B of the file.
    h.evaluate = [&] {
      double sum = 0;
      int64_t n = 0;
      for (int64_t i = 0; i < eval_batches && i * B < windows; ++i) {
        const int64_t count = std::min(B, windows - i * B);
        data::TokenBatch b = data::eval_windows(val_file, i * B, count, T);
        AutocastGuard amp(kBFloat16, bf16);
        sum += model->forward(b.x.to(dev), b.y.to(dev)).loss.item() * double(count);
        n += count;
      }
      return train::Metrics{{"val_loss", sum / double(n)}};
    };
    // The loss before any training, for comparison (a resumed run has it in its log).
    double initial = NAN;
    if (!f.resume) {
      model->eval();
      {
        NoGradGuard ng;
        initial = h.evaluate()[0].second;
        if (dp.main) std::fprintf(stderr, "step 0: val_loss %.4f\n", initial);
      }
      model->train();
    }
    train::LoopResult r = train::run_training(*model, opt, schedule, o, h);
    if (r.interrupted) return 130;
    if (!dp.main) return 0;  // the results below are rank 0's to print

    if (sample_tokens > 0) {
      model->eval();
      NoGradGuard ng;
      Generator g(experiments::mix_seed(f.seed, ~0ull));
      std::vector<int32_t> prompt;
      std::unique_ptr<data::Gpt2Tokenizer> gpt2;
      if (meta.tokenizer == "gpt2") {
        gpt2 = std::make_unique<data::Gpt2Tokenizer>(data::Gpt2Tokenizer::load());
        prompt = {gpt2->eot()};
      } else {
        prompt = meta.chars->encode("\n");
      }
      Tensor idx = from_vector(std::vector<int64_t>(prompt.begin(), prompt.end()), {1, int64_t(prompt.size())});
      Tensor out = model->generate(idx.to(dev), sample_tokens, temperature, top_k, &g);
      std::vector<int64_t> all = out.to_vector<int64_t>();
      std::vector<int32_t> ids(all.begin() + int64_t(prompt.size()), all.end());
      const std::string text = gpt2 ? gpt2->decode(ids) : meta.chars->decode(ids);
      std::printf("---- sample (temperature %.2f, top-k %lld) ----\n%s\n", temperature, (long long)top_k, text.c_str());
    }
    const double final_loss = r.last_eval.empty() ? NAN : r.last_eval[0].second;
    std::printf("final val_loss %.4f after %lld steps", final_loss, (long long)r.steps_done);
    if (!std::isnan(initial)) std::printf(" (%.4f before training)", initial);
    std::printf("\n");
    experiments::print_peak_memory(dev);
    if (expect_drop > 0 && !(initial - final_loss >= expect_drop)) {
      std::fprintf(stderr, "train_gpt2: the validation loss fell by %.4f nats (%.4f -> %.4f), less than the %.4f "
                   "expected\n", initial - final_loss, initial, final_loss, expect_drop);
      return 3;
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "train_gpt2: %s\n", e.what());
    return 1;
  }
  return 0;
}
