// μMoE paper, Figure 4: the top-activating patches (and their full images) of the first
// experts of two CPμMoE layers of a μMoE MLP-Mixer, an early and a late one: coarse
// specialisms (texture) early, finer ones (objects, parts) deeper. The paper's Mixer is
// S-16 on ImageNet-1k; here the CPμMoE Mixer of Table 3's local scale (Fashion-MNIST,
// patch 4, width 128, depth 4, 64 experts per block) is trained by train_mixer, or an
// existing run of it is reused (--from-run), and the channel-mixing blocks of the first
// and last Mixer block rank every (test image, patch) position by each expert's
// coefficient (nn::CoefficientCollector).
//
//   smoke: a 2-block Mixer of width 32 (patch 7), 20 steps (seconds; the test suite runs it)
//   local: the mixer-fmnist CPμMoE Mixer, 0.5 epoch (about 20 minutes on 2 cores), or the
//          run given with --from-run (e.g. repro_table3_mixer's runs/cp-seed0, one epoch)
//   paper: Mixer S-16 on ImageNet-1k: says what it needs and stops
//
//   repro_fig4_mixer_experts [--scale smoke|local|paper] [--out-dir DIR] [--from-run DIR]
//
// A run's directory holds checkpoint.safetensors (train_mixer's); the model is rebuilt
// from this program's configuration for the scale, and a checkpoint of another shape is
// refused by the strict load, naming the entry.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "data/fashion_mnist.h"
#include "data/loader.h"
#include "experiments/repro.h"
#include "experiments/repro_mixer.h"
#include "models/mlp_mixer.h"
#include "mumoe.h"
#include "nn/expert_analysis.h"
#include "nn/mumoe_block.h"
#include "tensor/safetensors.h"

using namespace mu;
using nlohmann::json;

int main(int argc, char** argv) {
  CLI::App app{"μMoE Figure 4: top-activating patches of the experts of an early and a late CPμMoE Mixer layer"};
  repro::Common common;
  repro::add_common_flags(app, common, "repro_fig4_mixer_experts");
  std::string from_run;
  app.add_option("--from-run", from_run, "A finished train_mixer run (--mlp cp, this scale's model) to analyse instead "
                                         "of training one");
  CLI11_PARSE(app, argc, argv);

  if (common.scale == repro::Scale::Paper) {
    std::printf(
        "repro_fig4_mixer_experts --scale paper: the paper's figure comes from μMoE Mixer S-16 models trained 300 epochs\n"
        "on ImageNet-1k. Needed and missing here: ImageNet-1k and an image pipeline for it (and the trained model).\n"
        "Nothing was run. The local scale draws the same figure for a CPμMoE Mixer trained on Fashion-MNIST.\n");
    return 2;
  }

  try {
    const bool smoke = common.scale == repro::Scale::Smoke;
    // A 2-block model at smoke scale, so that the first and last blocks differ.
    repro::MixerRuns mr = repro::mixer_runs(common.scale, 0.5, "repro_fig4_mixer_experts", /*smoke_depth=*/2,
                                            /*need_trainer=*/from_run.empty());
    models::MixerConfig& cfg = mr.config;
    cfg.token_block = cfg.channel_block = models::MixerMlp::CPMuMoE;
    std::vector<std::string> flags = {"--mlp", "cp", "--checkpoint-every", "0", "--no-progress", "--seed", "0"};
    flags.insert(flags.end(), mr.flags.begin(), mr.flags.end());

    std::string run = from_run;
    if (run.empty()) {
      repro::make_dir(common.out_dir + "/runs");
      run = common.out_dir + "/runs/cp-seed0";
      std::vector<std::string> args = {mr.trainer};
      args.insert(args.end(), flags.begin(), flags.end());
      repro::run_once(args, run, "test_acc", "CPμMoE Mixer");
    }
    const auto [test_acc, steps] = repro::last_eval(run + "/metrics.jsonl", "test_acc");

    // The model, from the run's checkpoint ("model.<name>" entries).
    manual_seed(0);
    models::MlpMixer model(cfg);
    const SafetensorsFile file = load_safetensors(run + "/checkpoint.safetensors");
    nn::StateDict sd;
    for (const auto& [name, t] : file.tensors)
      if (name.rfind("model.", 0) == 0) sd.emplace_back(name.substr(6), t);
    model.load_state_dict(sd);
    model.eval();
    std::printf("model: %s/checkpoint.safetensors (%lld steps, test accuracy %.2f%%)\n", run.c_str(), (long long)steps,
                100 * test_acc);

    // The first and the last block's channel-mixing CPμMoE: one coefficient vector per
    // patch, the positions of each image being its patches in row-major order.
    const std::vector<int64_t> layers = {0, cfg.depth - 1};
    const int64_t experts = cfg.experts, top_k = 8, shown = 3;
    std::vector<nn::CoefficientCollector> stats;
    for (size_t l = 0; l < layers.size(); ++l) stats.emplace_back(std::vector<int64_t>{experts}, top_k, 10);
    const data::FashionMnist ds = data::load_fashion_mnist();
    const int64_t rows = smoke ? 1000 : ds.test.size();
    {
      NoGradGuard no_grad;
      for (const Tensor& idx : data::DataLoader(rows, data::DataLoaderOptions(500).shuffle(false)).epoch()) {
        model.forward(index_select(ds.test.images, 0, idx));
        for (size_t l = 0; l < layers.size(); ++l) {
          auto moe = std::dynamic_pointer_cast<nn::MuMoE>(model.block(layers[l])->channel_mix);
          MU_CHECK(moe != nullptr, "block ", layers[l], "'s channel mixing is not a μMoE block");
          stats[l].add(moe->last_coefficients(), idx, index_select(ds.test.labels, 0, idx));
        }
      }
    }

    // The figure's data: for each layer, the first experts' top positions, with the image
    // and the patch's place in it.
    const int64_t p = cfg.patch_size, grid = cfg.grid();
    json panels = json::array(), summary = json::array();
    for (size_t l = 0; l < layers.size(); ++l) {
      json experts_json = json::array();
      for (int64_t n = 0; n < std::min(shown, experts); ++n) {
        json tops = json::array();
        std::vector<int64_t> label_counts(10, 0);
        for (const nn::ExpertActivation& act : stats[l].top_k(0, n)) {
          const int64_t label = ds.test.labels.select(0, act.index).item<int64_t>();
          label_counts[size_t(label)] += 1;
          tops.push_back({{"index", act.index}, {"patch_row", act.position / grid}, {"patch_col", act.position % grid},
                          {"coefficient", act.coefficient}, {"label", label},
                          {"pixels", ds.test.images.select(0, act.index).to_vector<float>()}});
        }
        experts_json.push_back({{"expert", n}, {"top", tops}});
        summary.push_back({{"layer", layers[l]}, {"expert", n}, {"top_labels", label_counts}});
      }
      panels.push_back({{"layer", layers[l]}, {"experts", experts_json}});
    }
    const std::string png = common.out_dir + "/fig4_mixer_experts.png";
    repro::make_dir(common.out_dir);
    repro::draw_png(png,
                    "import numpy as np\n"
                    "from matplotlib.patches import Rectangle\n"
                    "names = ['T-shirt', 'Trouser', 'Pullover', 'Dress', 'Coat', 'Sandal', 'Shirt', 'Sneaker', 'Bag', 'Boot']\n"
                    "p = data['patch']\n"
                    "panels = data['panels']\n"
                    "k = max(len(e['top']) for pan in panels for e in pan['experts'])\n"
                    "rows = sum(2 * len(pan['experts']) for pan in panels)\n"
                    "fig, axes = plt.subplots(rows, k + 1, figsize=(0.9 * (k + 1), 0.95 * rows), squeeze=False)\n"
                    "for ax in axes.flat: ax.axis('off')\n"
                    "r = 0\n"
                    "for pan in panels:\n"
                    "    for e in pan['experts']:\n"
                    "        axes[r][0].text(0.95, 0.0, f\"block {pan['layer']}\\nexpert {e['expert']}\", ha='right', va='center', fontsize=7)\n"
                    "        for c, t in enumerate(e['top']):\n"
                    "            img = np.array(t['pixels']).reshape(28, 28)\n"
                    "            y0, x0 = t['patch_row'] * p, t['patch_col'] * p\n"
                    "            axes[r][c + 1].imshow(img[y0:y0 + p, x0:x0 + p], cmap='gray', vmin=0, vmax=1)\n"
                    "            axes[r][c + 1].set_title(f\"{t['coefficient']:.2f}\", fontsize=5)\n"
                    "            axes[r + 1][c + 1].imshow(img, cmap='gray', vmin=0, vmax=1)\n"
                    "            axes[r + 1][c + 1].add_patch(Rectangle((x0 - 0.5, y0 - 0.5), p, p, fill=False, color='lime', lw=0.8))\n"
                    "            axes[r + 1][c + 1].set_title(names[t['label']], fontsize=5)\n"
                    "        r += 2\n",
                    {{"patch", p}, {"panels", panels}});
    std::printf("figure: %s\n", png.c_str());
    for (const json& s : summary) {
      const auto counts = s["top_labels"].get<std::vector<int64_t>>();
      std::string labels;
      for (int64_t c = 0; c < 10; ++c)
        if (counts[size_t(c)] > 0)
          labels += (labels.empty() ? "" : ", ") + std::string(data::kFashionMnistClasses[size_t(c)]) + " x" +
                    std::to_string(counts[size_t(c)]);
      std::printf("  block %lld expert %lld: top-%lld patches from %s\n", (long long)s["layer"].get<int64_t>(),
                  (long long)s["expert"].get<int64_t>(), (long long)top_k, labels.c_str());
    }
    repro::save_results(common, "fig4_mixer_experts.json",
                        {{"program", "repro_fig4_mixer_experts"}, {"scale", repro::scale_name(common.scale)},
                         {"run", run}, {"steps", steps}, {"test_accuracy", test_acc}, {"layers", layers},
                         {"top_k", top_k}, {"experts", summary}, {"figures", {"fig4_mixer_experts.png"}}});
  } catch (const mu::Error& e) {
    std::fprintf(stderr, "repro_fig4_mixer_experts: %s\n", e.what());
    return 1;
  }
  return 0;
}
