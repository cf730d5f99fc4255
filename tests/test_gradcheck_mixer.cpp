// Gradchecks of the Mixer's new differentiable pieces: DropPath (with a fixed mask: its
// generator reseeded before each evaluation), and a whole small Mixer in float64 with
// respect to its input images, for MLP and μMoE (batch-norm gated) blocks.
#include "helpers.h"
#include "models/mlp_mixer.h"
#include "nn/drop_path.h"

using namespace mu;
using autograd::TensorList;

TEST_CASE("gradcheck: DropPath in training mode") {
  for (Device dev : test_devices()) {
    Generator gen(5);
    nn::DropPath dp(nn::DropPathOptions(0.4).generator(&gen));
    auto fn = [&](const TensorList& t) {
      gen.manual_seed(5);  // the same per-sample mask at every evaluation
      return dp.forward(t[0]);
    };
    CHECK_GRAD(fn, TensorList{on(rnd({6, 3, 2}, 1), dev)});
    // The mask is per sample: some samples kept, some dropped at this seed.
    gen.manual_seed(5);
    Tensor y = dp.forward(ones({6, 3, 2}, TensorOptions(kFloat64).device(dev)));
    auto v = y.to_vector<double>();
    int kept = 0;
    for (int b = 0; b < 6; ++b) kept += v[size_t(b * 6)] != 0;
    CHECK(kept > 0);
    CHECK(kept < 6);
  }
}

TEST_CASE("gradcheck: a small Mixer with respect to its images") {
  for (auto kind : {models::MixerMlp::MLP, models::MixerMlp::TRMuMoE, models::MixerMlp::CPMuMoE}) {
    const std::string kind_name = models::to_string(kind);
    CAPTURE(kind_name);
    models::MixerConfig c;
    c.image_size = 4;
    c.channels = 1;
    c.patch_size = 2;
    c.width = 6;
    c.token_mlp = 5;
    c.channel_mlp = 8;
    c.depth = 1;
    c.num_classes = 3;
    c.experts = 4;
    c.tr_rank_ratio = 0.5;
    c.mlp(kind);
    manual_seed(8);
    models::MlpMixer m(c);
    m.to(kFloat64);
    {
      autograd::NoGradGuard g;
      for (auto& [name, t] : m.named_parameters())
        if (name.size() > 3 && name.compare(name.size() - 3, 3, ".G1") == 0) t.set_data(randn(t.shape(), kFloat64));
    }
    CHECK_GRAD([&](const TensorList& t) { return m.forward(t[0]); }, TensorList{rnd({3, 1, 4, 4}, 2)});
  }
}
