// The MxD "model form" notebook (../shared/papers/mxd-model-form-notebook.txt) as a
// program: builds its Hadamard-factorised layer (32 experts, 16 -> 64, float64) and prints
// each of its equivalences with the largest absolute difference between the two sides,
// then each expert's rank and the experts' mean normalised rank (the notebook: 1.0).
// The same at every scale; --seeds repeats it over several random draws.
//
//   repro_mxd_notebook [--scale smoke|local|paper] [--out-dir DIR] [--seeds N]
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "experiments/mxd_model_form.h"
#include "experiments/repro.h"

using namespace mu;
using nlohmann::json;

namespace {

// The largest |a - b| over all elements (same shapes).
double max_abs_diff(const Tensor& a, const Tensor& b) {
  MU_CHECK(a.shape() == b.shape(), "repro_mxd_notebook: comparing shapes ", shape_str(a.shape()), " and ",
           shape_str(b.shape()));
  const std::vector<double> x = a.contiguous().to_vector<double>(), y = b.contiguous().to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::fabs(x[i] - y[i]));
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The MxD model-form notebook: its equivalences and the experts' mean rank"};
  repro::Common common;
  repro::add_common_flags(app, common, "repro_mxd_notebook");
  int seeds = 1;
  app.add_option("--seeds", seeds, "Random draws of the layer (the notebook: one)")->capture_default_str()
      ->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);

  try {
    // Each equivalence's worst difference over the draws; the notebook asserts allclose.
    struct Check {
      const char* what;
      double worst = 0;
    };
    std::vector<Check> checks = {
        {"(i) Khatri-Rao parameterisation of the mode-3 unfolding (Kolda-Bader order, (D ⊙ C)ᵀ) = W"},
        {"(i) the same in tensorly's C order, (C ⊙ D)ᵀ = W"},
        {"(ii) factorised (Cᵀa) ∗ (Dᵀz) = explicit Σ_n a_n W[n]ᵀ z"},
        {"(iii) mode-n products W ×₁ a ×₂ z = factorised"},
        {"(iii) mode-n products = explicit"},
        {"(iv) experts D · diag(C[n]) are W's slices"},
        {"(iv) Σ_n a_n W_nᵀ z over the materialised experts = explicit"}};
    double rank_sum = 0;
    int64_t rank_count = 0, full_rank = 0;
    json draws = json::array();
    for (int s = 0; s < seeds; ++s) {
      const mxd::ModelForm f(42 + uint64_t(s));
      const Tensor y_fac = f.factorised_output(), y_exp = f.explicit_output(), y_mod = f.mode_n_output();
      Tensor y_rank = zeros({mxd::ModelForm::O}, kFloat64);
      double slice = 0;
      std::vector<int64_t> ranks;
      for (int64_t n = 0; n < mxd::ModelForm::N; ++n) {
        const Tensor wn = f.expert(n);
        slice = std::max(slice, max_abs_diff(wn, f.W.select(0, n)));
        ranks.push_back(tensor_algebra::matrix_rank(wn));
        y_rank = y_rank + matmul(wn.t(), f.z) * f.a.select(0, n);
      }
      const double d[] = {max_abs_diff(f.khatri_rao_kolda_bader(), f.W), max_abs_diff(f.khatri_rao_tensorly(), f.W),
                          max_abs_diff(y_fac, y_exp), max_abs_diff(y_mod, y_fac), max_abs_diff(y_mod, y_exp), slice,
                          max_abs_diff(y_rank, y_exp)};
      for (size_t k = 0; k < checks.size(); ++k) checks[k].worst = std::max(checks[k].worst, d[k]);
      const int64_t full = std::min(mxd::ModelForm::H, mxd::ModelForm::O);
      for (int64_t r : ranks) rank_sum += double(r) / double(full), ++rank_count, full_rank += r == full;
      draws.push_back({{"seed", 42 + s}, {"ranks", ranks}});
    }
    repro::Table t{"MxD notebook: equivalences (float64; the notebook asserts each with torch.allclose)",
                   {"equivalence", "largest absolute difference"}, {}};
    json out_checks = json::array();
    for (const Check& c : checks) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.2e", c.worst);
      t.rows.push_back({c.what, buf});
      out_checks.push_back({{"what", c.what}, {"max_abs_diff", c.worst}});
    }
    const double mean_rank = rank_sum / double(rank_count);
    std::printf("# MxD model form (scale %s; the same at every scale)\n\n%s\n", repro::scale_name(common.scale),
                t.markdown().c_str());
    std::printf("Mean (normalized) rank of experts: %.4f (notebook: 1.0); %lld of %lld experts have full rank %lld "
                "over %d draw%s.\n",
                mean_rank, (long long)full_rank, (long long)rank_count,
                (long long)std::min(mxd::ModelForm::H, mxd::ModelForm::O), seeds, seeds == 1 ? "" : "s");
    json out = {{"program", "repro_mxd_notebook"}, {"scale", repro::scale_name(common.scale)},
                {"checks", out_checks}, {"mean_normalised_rank", mean_rank}, {"draws", draws}};
    repro::save_results(common, "mxd_notebook.json", out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "repro_mxd_notebook: %s\n", e.what());
    return 1;
  }
  return 0;
}
