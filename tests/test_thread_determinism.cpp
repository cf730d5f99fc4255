// Training steps give bit-identical results on 1 and 2 CPU threads: every reduction and
// every GEMM splits its work the same way whatever the thread count (a sum's order may
// not depend on who computes it), so a run can be reproduced on another machine.
// Each model trains three AdamW steps from the same seed under each thread count; the
// losses and every parameter afterwards must agree to the bit. The sizes put every
// activation above the loops' parallel grain (ops/cpu/loops.h: 32768 elements), so the
// two-thread runs do split the work.
#include <omp.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "helpers.h"

using namespace mu;

namespace {

struct Run {
  std::vector<double> losses;
  std::vector<std::vector<float>> params;
};

// Three steps of `step` (returns the loss, having run backward) with AdamW on `params`.
Run train_three_steps(const std::function<std::vector<Tensor>()>& make, const std::function<Tensor()>& loss) {
  std::vector<Tensor> params = make();
  optim::AdamW adamw(params, optim::AdamWOptions(1e-3).weight_decay(0.1));
  Run r;
  for (int s = 0; s < 3; ++s) {
    adamw.zero_grad();
    Tensor l = loss();
    l.backward();
    adamw.step();
    r.losses.push_back(l.item());
  }
  for (const Tensor& p : params) r.params.push_back(p.to_vector<float>());
  return r;
}

// The same training under 1 and 2 threads, compared bit for bit.
void check_threads(const char* what, const std::function<Run()>& run) {
  INFO(std::string(what));
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const Run one = run();
  omp_set_num_threads(2);
  const Run two = run();
  omp_set_num_threads(saved);
  REQUIRE(one.losses.size() == two.losses.size());
  for (size_t i = 0; i < one.losses.size(); ++i) {
    INFO("step " << i << ": " << one.losses[i] << " vs " << two.losses[i]);
    CHECK(std::memcmp(&one.losses[i], &two.losses[i], sizeof(double)) == 0);
  }
  REQUIRE(one.params.size() == two.params.size());
  size_t differing = 0;
  for (size_t i = 0; i < one.params.size(); ++i)
    differing += one.params[i].size() != two.params[i].size() ||
                 std::memcmp(one.params[i].data(), two.params[i].data(), one.params[i].size() * sizeof(float)) != 0;
  CHECK_MESSAGE(differing == 0, differing << " of " << one.params.size() << " parameters differ");
}

}  // namespace

TEST_CASE("GPT-2 steps (dense, CPμMoE, TRμMoE MLPs) are identical on 1 and 2 threads") {
  for (const char* kind : {"dense", "cp", "tr"}) {
    models::GPT2Config c;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_embd = 64;
    c.block_size = 64;
    c.vocab_size = 300;
    if (std::string(kind) == "cp") c.mlp = models::mlp::cp_mumoe(16, 48);
    if (std::string(kind) == "tr") c.mlp = models::mlp::tr_mumoe(16, 12);
    check_threads(kind, [&] {
      manual_seed(5);
      auto model = std::make_shared<models::GPT2>(c);
      Generator data(6);
      const Tensor idx = randint(0, c.vocab_size, {8, c.block_size}, TensorOptions(kInt64), &data);
      const Tensor tgt = randint(0, c.vocab_size, {8, c.block_size}, TensorOptions(kInt64), &data);
      return train_three_steps([&] { return model->parameters(); }, [&] { return model->forward(idx, tgt).loss; });
    });
  }
}

TEST_CASE("MLP-Mixer steps (dense and CPμMoE channel MLPs) are identical on 1 and 2 threads") {
  for (models::MixerMlp kind : {models::MixerMlp::MLP, models::MixerMlp::CPMuMoE}) {
    models::MixerConfig c;
    c.image_size = 16;
    c.channels = 1;
    c.patch_size = 4;
    c.width = 64;
    c.token_mlp = 32;
    c.channel_mlp = 128;
    c.depth = 2;
    c.num_classes = 10;
    c.experts = 16;
    c.mlp(kind);
    check_threads(kind == models::MixerMlp::MLP ? "mixer dense" : "mixer cp", [&] {
      manual_seed(7);
      auto model = std::make_shared<models::MlpMixer>(c);
      Generator data(8);
      const Tensor img = rand({32, 1, 16, 16}, TensorOptions(kFloat32), &data);
      const Tensor y = randint(0, 10, {32}, TensorOptions(kInt64), &data);
      return train_three_steps([&] { return model->parameters(); }, [&] { return cross_entropy(model->forward(img), y); });
    });
  }
}
