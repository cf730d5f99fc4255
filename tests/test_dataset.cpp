// Datasets (TensorDataset, Subset, random_split) and the loader's (input, target)
// batches, checked against index arithmetic done here by hand.
#include <algorithm>
#include <set>

#include "helpers.h"

using namespace mu;

namespace {

// Inputs whose row i is (10 i, 10 i + 1, 10 i + 2) and targets 100 + i, so any row tells
// which example it came from.
data::TensorDataset numbered(int64_t n) {
  Tensor x = (arange(n).to_double() * 10.0).unsqueeze(1) + tensor({0.0, 1.0, 2.0});
  return data::TensorDataset(x, arange(n) + 100);
}

// The example numbers a batch holds, read from its targets; checks its inputs agree.
std::vector<int64_t> examples_of(const data::Batch& b) {
  std::vector<int64_t> ids;
  const std::vector<int64_t> t = b.target.to_vector<int64_t>();
  const std::vector<double> x = b.input.to_vector<double>();
  for (size_t r = 0; r < t.size(); ++r) {
    ids.push_back(t[r] - 100);
    for (int c = 0; c < 3; ++c) CHECK(x[r * 3 + c] == double(ids.back() * 10 + c));
  }
  return ids;
}

}  // namespace

TEST_CASE("TensorDataset gives the rows at the indices, in their order") {
  const data::TensorDataset ds = numbered(6);
  CHECK(ds.size() == 6);
  CHECK(examples_of(ds.get(tensor({4, 0, 4}))) == std::vector<int64_t>{4, 0, 4});
  auto [x, y] = ds.get(tensor({5}));
  CHECK(x.shape() == Shape{1, 3});
  CHECK(y.item<int64_t>() == 105);
  CHECK(ds.get(full({}, 2, kInt64)).input.shape() == Shape{1, 3});  // a 0-D index is one example
  CHECK_THROWS_MU(ds.get(tensor({6})), "TensorDataset::get: index 6 is out of range for a dataset of 6 examples");
  CHECK_THROWS_MU(ds.get(tensor({-1})), "index -1 is out of range");
  CHECK_THROWS_MU(ds.get(tensor({1.0})), "indices must be int64, got float32");
  CHECK_THROWS_MU(ds.get(zeros({2, 2}, kInt64)), "0-D or 1-D, got shape [2, 2]");
  CHECK_THROWS_MU(data::TensorDataset(zeros({5, 3}), zeros({4}, kInt64)),
                  "inputs hold 5 examples ([5, 3]) but targets hold 4 ([4])");
  CHECK_THROWS_MU(data::TensorDataset(Tensor(), zeros({4})), "must be defined");
  CHECK_THROWS_MU(data::TensorDataset(zeros({}), zeros({})), "first (example) dim");
}

TEST_CASE("Subset maps its indices through the base, subsets of subsets too") {
  auto base = std::make_shared<data::TensorDataset>(numbered(10));
  auto sub = std::make_shared<data::Subset>(base, tensor({7, 2, 9, 2}));
  CHECK(sub->size() == 4);
  CHECK(examples_of(sub->get(tensor({0, 3, 1}))) == std::vector<int64_t>{7, 2, 2});
  data::Subset subsub(sub, tensor({2, 0}));
  CHECK(examples_of(subsub.get(tensor({0, 1}))) == std::vector<int64_t>{9, 7});
  CHECK_THROWS_MU(sub->get(tensor({4})), "Subset::get: index 4 is out of range for a dataset of 4 examples");
  CHECK_THROWS_MU(data::Subset(base, tensor({3, 10})), "Subset: index 10 is out of range for a base dataset of 10");
  CHECK_THROWS_MU(data::Subset(base, tensor({1.0})), "1-D int64 tensor");
  CHECK_THROWS_MU(data::Subset(nullptr, tensor({1})), "no base dataset");
}

TEST_CASE("random_split: disjoint subsets covering the dataset, sizes as torch rounds them") {
  const data::TensorDataset ds = numbered(10);
  Generator g(5);
  std::vector<data::Subset> parts = data::random_split(ds, {7, 3}, &g);
  REQUIRE(parts.size() == 2);
  CHECK(parts[0].size() == 7);
  CHECK(parts[1].size() == 3);
  std::set<int64_t> seen;
  for (const data::Subset& p : parts)
    for (int64_t i : examples_of(p.get(arange(p.size())))) CHECK(seen.insert(i).second);
  CHECK(seen.size() == 10);
  // The same generator seed gives the same split; another seed another one.
  Generator g2(5), g3(6);
  CHECK(data::random_split(ds, {7, 3}, &g2)[0].indices().to_vector<int64_t>() == parts[0].indices().to_vector<int64_t>());
  CHECK(data::random_split(ds, {7, 3}, &g3)[0].indices().to_vector<int64_t>() != parts[0].indices().to_vector<int64_t>());

  // Fractions: floor(f · n) each, the remainder dealt one by one from the first subset
  // (torch: 10 · (0.34, 0.33, 0.33) -> 3, 3, 3, then 1 more to the first -> 4, 3, 3).
  auto sizes = [&](const std::vector<double>& f, int64_t n) {
    std::vector<int64_t> s;
    for (const data::Subset& p : data::random_split(numbered(n), f)) s.push_back(p.size());
    return s;
  };
  CHECK(sizes({0.34, 0.33, 0.33}, 10) == std::vector<int64_t>{4, 3, 3});
  CHECK(sizes({0.5, 0.5}, 7) == std::vector<int64_t>{4, 3});
  CHECK(sizes({0.25, 0.25, 0.25, 0.25}, 6) == std::vector<int64_t>{2, 2, 1, 1});
  CHECK(sizes({1.0, 0.0}, 5) == std::vector<int64_t>{5, 0});
  CHECK(sizes({0.9, 0.1}, 60000) == std::vector<int64_t>{54000, 6000});

  CHECK_THROWS_MU(data::random_split(ds, {6, 3}), "the lengths sum to 9 but the dataset holds 10 examples");
  CHECK_THROWS_MU(data::random_split(ds, {2.5, 7.5}), "whole numbers of examples or fractions summing to 1, got 2.5");
  CHECK_THROWS_MU(data::random_split(ds, {0.5, 0.4}), "whole numbers");
  CHECK_THROWS_MU(data::random_split(ds, {11, -1}), "lengths must be finite and >= 0, got -1");
  CHECK_THROWS_MU(data::random_split(ds, {}), "no lengths");
}

TEST_CASE("a DataLoader over a dataset yields (input, target) batches in epoch() order") {
  auto ds = std::make_shared<data::TensorDataset>(numbered(10));
  Generator g1(3), g2(3);
  data::DataLoader by_index(10, data::DataLoaderOptions(4).generator(&g1));
  data::DataLoader by_batch(ds, data::DataLoaderOptions(4).generator(&g2));
  CHECK(by_batch.size() == 10);
  const std::vector<Tensor> order = by_index.epoch();
  int64_t k = 0;
  std::vector<int64_t> all;
  for (auto [x, y] : by_batch.batches()) {
    REQUIRE(k < int64_t(order.size()));
    const std::vector<int64_t> ids = examples_of({x, y});
    CHECK(ids == order[size_t(k)].to_vector<int64_t>());
    all.insert(all.end(), ids.begin(), ids.end());
    ++k;
  }
  CHECK(k == 3);  // 4 + 4 + 2
  std::sort(all.begin(), all.end());
  CHECK(all == arange(10).to_vector<int64_t>());

  // drop_last and no shuffling: two batches, in index order; over a subset, its examples.
  auto sub = std::make_shared<data::Subset>(ds, tensor({9, 8, 7, 6, 5}));
  data::DataLoader plain(sub, data::DataLoaderOptions(2).shuffle(false).drop_last(true));
  std::vector<std::vector<int64_t>> got;
  for (const data::Batch& b : plain.batches()) got.push_back(examples_of(b));
  CHECK(got == std::vector<std::vector<int64_t>>{{9, 8}, {7, 6}});

  data::DataLoader sized(10, data::DataLoaderOptions(4));
  CHECK_THROWS_MU(sized.batches(), "made with a size (10), not a dataset");
  CHECK_THROWS_MU(data::DataLoader(std::shared_ptr<const data::Dataset>(), data::DataLoaderOptions(4)), "no dataset");
}
