// What every reproduction program (experiments/repro_*.cpp) shares: the --scale and
// --out-dir flags, the Markdown tables printed with the paper's numbers beside ours, the
// results JSON (written atomically: a reader never sees half a file), and figures drawn
// as PNG by matplotlib through /usr/bin/python3 (Debian: python3-matplotlib).
//
// Scales: `smoke` runs in seconds (the test suite runs it), `local` fits this 2-core
// machine in at most 30 minutes, `paper` is the paper's configuration. Programs whose
// results are counts run the same at every scale and say so.
#pragma once
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <csignal>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tensor/atomic_file.h"
#include "tensor/error.h"

namespace mu::repro {

enum class Scale { Smoke, Local, Paper };

inline const char* scale_name(Scale s) {
  switch (s) {
    case Scale::Smoke: return "smoke";
    case Scale::Local: return "local";
    case Scale::Paper: return "paper";
  }
  return "?";
}

struct Common {
  Scale scale = Scale::Local;
  std::string out_dir;  // results JSON and figures
};

// --scale smoke|local|paper and --out-dir (default repro_results/<program>).
inline void add_common_flags(CLI::App& app, Common& c, const std::string& program) {
  c.out_dir = "repro_results/" + program;
  const std::map<std::string, Scale> scales{{"smoke", Scale::Smoke}, {"local", Scale::Local}, {"paper", Scale::Paper}};
  app.add_option("--scale", c.scale, "smoke (seconds), local (this machine, <= 30 min) or paper (the paper's setting)")
      ->transform(CLI::CheckedTransformer(scales, CLI::ignore_case))
      ->capture_default_str();
  app.add_option("--out-dir", c.out_dir, "Directory for the results JSON and figures (created)")->capture_default_str();
}

// A flag of the other scale is refused rather than ignored (a `--device cuda` at local
// scale would otherwise run on the CPU without a word): the options of `paper_group` take
// effect at --scale paper only, those in `local_only` at smoke and local only. Returns the
// message naming the first flag given out of its scale, or "" when there is none.
inline std::string flags_out_of_scale(const Common& c, CLI::App* paper_group,
                                      const std::vector<CLI::Option*>& local_only) {
  if (c.scale != Scale::Paper) {
    for (const CLI::Option* o : paper_group->get_options())
      if (o->count() > 0) return o->get_name() + " applies to --scale paper only (its runs' recipe)";
  } else {
    for (const CLI::Option* o : local_only)
      if (o->count() > 0)
        return o->get_name() + " applies to --scale smoke and local only (the paper recipe's flags are listed under "
                               "'paper scale' in --help)";
  }
  return "";
}

// 1069568 -> "1,069,568".
inline std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

// n with `decimals` decimals in the largest of K, M, B, T it reaches: 57048096 -> "57.0M".
inline std::string scaled(double n, int decimals = 1) {
  const char* suffix[] = {"", "K", "M", "B", "T"};
  int k = 0;
  while (k < 4 && std::fabs(n) >= 1000.0) n /= 1000.0, ++k;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f%s", k == 0 ? 0 : decimals, n, suffix[k]);
  return buf;
}

// A table: printed as Markdown, stored in the results JSON as {title, header, rows}.
struct Table {
  std::string title;
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;

  std::string markdown() const {
    auto line = [](const std::vector<std::string>& cells) {
      std::string s = "|";
      for (const std::string& c : cells) s += " " + c + " |";
      return s + "\n";
    };
    std::string s = "**" + title + "**\n\n" + line(header) + "|";
    for (size_t i = 0; i < header.size(); ++i) s += "---|";
    s += "\n";
    for (const auto& r : rows) s += line(r);
    return s;
  }
  nlohmann::json to_json() const { return {{"title", title}, {"header", header}, {"rows", rows}}; }
};

inline void make_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  MU_CHECK(!ec, "cannot create directory ", dir, ": ", ec.message());
}

// `j` into `path`, indented, atomically (tensor/atomic_file.h).
inline void write_json(const std::string& path, const nlohmann::json& j) {
  const std::string text = j.dump(2) + "\n";
  write_file_atomically(path, {{text.data(), text.size()}}, "write results " + path);
}

// The results JSON into <out-dir>/<file> (the directory created), and its path printed.
inline void save_results(const Common& c, const std::string& file, const nlohmann::json& j) {
  make_dir(c.out_dir);
  const std::string path = c.out_dir + "/" + file;
  write_json(path, j);
  std::printf("results: %s\n", path.c_str());
}

// Runs /usr/bin/python3 on `args` and waits; the exit status, or -1 when it could not start.
inline int run_python(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  std::string python = "/usr/bin/python3";
  argv.push_back(python.data());
  std::vector<std::string> copy = args;
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Draws `png_path` with matplotlib: `body` is Python run with `data` (the JSON given here,
// as a dict) and `plt` (matplotlib.pyplot, Agg backend) defined, and must draw one figure;
// the figure is saved to a temporary name and renamed over png_path. A missing python3 or
// matplotlib, or a failing script, is a mu::Error naming what to install or what failed.
inline void draw_png(const std::string& png_path, const std::string& body, const nlohmann::json& data) {
  const std::string stem = png_path + ".tmp." + std::to_string(getpid());
  const std::string data_path = stem + ".json", script_path = stem + ".py", tmp_png = stem + ".png";
  const std::string script =
      "import json, os, sys\n"
      "try:\n"
      "    import matplotlib\n"
      "except ImportError:\n"
      "    sys.exit(3)\n"
      "matplotlib.use('Agg')\n"
      "import matplotlib.pyplot as plt\n"
      "data = json.load(open(sys.argv[1]))\n" +
      body +
      "\nplt.tight_layout()\n"
      "plt.savefig(sys.argv[2], dpi=120)\n"
      "os.replace(sys.argv[2], sys.argv[3])\n";
  const std::string data_text = data.dump();
  write_file_atomically(data_path, {{data_text.data(), data_text.size()}}, "plot data " + data_path);
  write_file_atomically(script_path, {{script.data(), script.size()}}, "plot script " + script_path);
  const int rc = run_python({script_path, data_path, tmp_png, png_path});
  std::filesystem::remove(data_path);
  std::filesystem::remove(script_path);
  std::filesystem::remove(tmp_png);
  MU_CHECK(rc != -1 && rc != 127, "drawing ", png_path, ": cannot run /usr/bin/python3 (install python3)");
  MU_CHECK(rc != 3, "drawing ", png_path, ": python3 has no matplotlib (install python3-matplotlib)");
  MU_CHECK(rc == 0, "drawing ", png_path, ": the plotting script failed (exit status ", rc, ")");
}

// The directory of the running program (the other programs are built beside it).
inline std::string program_dir() {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  MU_CHECK(!ec, "cannot locate the running executable: ", ec.message());
  return self.parent_path().string();
}

// Runs `args` (args[0] a path) with stdout and stderr into `log` (appended to when
// `append`, else replaced); its exit status (128 + the signal when a signal ended it).
// While the child runs this process ignores Ctrl-C and SIGTERM, which reach the child
// too (the same process group): a trainer saves its checkpoint and exits with 130, and
// the caller sees that status instead of dying before the checkpoint is written.
inline int run_program(const std::vector<std::string>& args, const std::string& log, bool append = false) {
  std::vector<char*> argv;
  std::vector<std::string> copy = args;
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  struct sigaction ignore {}, old_int {}, old_term {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGINT, &ignore, &old_int);
  sigaction(SIGTERM, &ignore, &old_term);
  const pid_t pid = fork();
  if (pid == 0) {
    // An ignored signal stays ignored across exec: give the child the defaults back.
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
    FILE* f = std::freopen(log.c_str(), append ? "a" : "w", stdout);
    if (f == nullptr || dup2(fileno(stdout), 2) < 0) _exit(126);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  const bool waited = pid > 0 && waitpid(pid, &status, 0) >= 0;
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  MU_CHECK(pid >= 0, "fork failed running ", args[0]);
  MU_CHECK(waited, "waitpid failed running ", args[0]);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

// The last evaluation record of a run's metrics.jsonl (train/metrics_log.h) holding
// `key`: (value, step), or (NaN, -1) when there is none (not run, or stopped before).
inline std::pair<double, int64_t> last_eval(const std::string& metrics_path, const std::string& key) {
  std::ifstream in(metrics_path);
  std::string line;
  std::pair<double, int64_t> last{NAN, -1};
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("kind", "") == "eval" && j.contains(key) && j[key].is_number())
      last = {j[key].get<double>(), j["step"].get<int64_t>()};
  }
  return last;
}

// <out-dir>/data: `corpus` tokenized by prepare_text (beside this program) with `tokenizer`,
// once (an existing meta.json is kept); its log goes to <out-dir>/prepare_text.log.
inline std::string prepared_corpus(const Common& c, const std::string& corpus, const std::string& tokenizer) {
  const std::string data = c.out_dir + "/data";
  if (!std::filesystem::exists(data + "/meta.json")) {
    make_dir(c.out_dir);
    std::printf("tokenizing %s (%s) into %s ...\n", corpus.c_str(), tokenizer.c_str(), data.c_str());
    const int rc = run_program({program_dir() + "/prepare_text", "--corpus", corpus, "--tokenizer", tokenizer, "--out",
                                data},
                               c.out_dir + "/prepare_text.log");
    MU_CHECK(rc == 0, "prepare_text exited with status ", rc, "; its output is in ", c.out_dir, "/prepare_text.log");
  }
  return data;
}

// The parameter count a trainer printed in its log ("... N parameters"); 0 when there is none.
inline int64_t logged_params(const std::string& log_path) {
  std::ifstream log(log_path);
  for (std::string line; std::getline(log, line);) {
    const size_t at = line.find(" parameters");
    if (at == std::string::npos || at == 0) continue;
    const size_t space = line.rfind(' ', at - 1);
    const size_t from = space == std::string::npos ? 0 : space + 1;
    return std::stoll(line.substr(from, at - from));
  }
  return 0;
}

// Mean and sample standard deviation (n - 1; 0 for one value).
struct MeanStd {
  double mean = NAN, std = NAN;
};
inline MeanStd mean_std(const std::vector<double>& v) {
  MeanStd s;
  if (v.empty()) return s;
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / double(v.size());
  double ss = 0;
  for (double x : v) ss += (x - s.mean) * (x - s.mean);
  s.std = v.size() > 1 ? std::sqrt(ss / double(v.size() - 1)) : 0.0;
  return s;
}

// "m ± s" with `decimals` decimals.
inline std::string pm(const MeanStd& s, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f ± %.*f", decimals, s.mean, decimals, s.std);
  return buf;
}

// The command line of a run, one argument per line (dir/command.txt records it); the
// program by its name alone, so that a build elsewhere still finds its finished runs.
inline std::string command_text(const std::vector<std::string>& args) {
  std::string text;
  for (size_t i = 0; i < args.size(); ++i)
    text += (i == 0 ? std::filesystem::path(args[i]).filename().string() : args[i]) + "\n";
  return text;
}

// One training run of a seed sweep: `args` (the trainer and its flags, without
// --out-dir) into `dir`, unless dir/metrics.jsonl already ends in an evaluation of
// `key` from the same command (a finished run: an interrupted reproduction resumes where
// it stopped; a run made with other flags, as dir/command.txt records them, is run
// again). Returns that evaluation; a failing run is a mu::Error naming its log.
inline std::pair<double, int64_t> run_once(std::vector<std::string> args, const std::string& dir,
                                          const std::string& key, const std::string& label) {
  const std::string command = command_text(args);
  std::pair<double, int64_t> r = last_eval(dir + "/metrics.jsonl", key);
  std::ifstream recorded_file(dir + "/command.txt");
  const std::string recorded((std::istreambuf_iterator<char>(recorded_file)), std::istreambuf_iterator<char>());
  // A run directory without command.txt predates the record and is taken as it is.
  if (r.second >= 0 && (!recorded_file.is_open() || recorded == command)) return r;
  std::filesystem::remove_all(dir);
  args.insert(args.begin() + 1, {"--out-dir", dir});
  std::printf("running %s ...\n", label.c_str());
  const int rc = run_program(args, dir + ".log");
  MU_CHECK(rc == 0, args[0], " exited with status ", rc, " for ", label, "; its output is in ", dir, ".log");
  r = last_eval(dir + "/metrics.jsonl", key);
  MU_CHECK(r.second >= 0, dir, "/metrics.jsonl holds no evaluation of ", key);
  write_file_atomically(dir + "/command.txt", {{command.data(), command.size()}}, "run_once");
  return r;
}

// A trainer's status when Ctrl-C or SIGTERM stopped it after saving its checkpoint.
inline constexpr int kInterruptedStatus = 130;

// One long training run (the paper scale) into `dir`, resumable: `args` is the trainer
// and its flags without --out-dir and --resume, and `steps` its --max-steps. A run whose
// metrics end in an evaluation of `key` at step `steps` is finished and not run again; a
// run with a checkpoint continues from it (--resume, its log appended to); otherwise it
// starts afresh. Returns the final evaluation, or step -1 when the trainer was
// interrupted (its checkpoint saved: running the same command again continues it).
// A failing run is a mu::Error naming its log. A checkpoint is never deleted here.
inline std::pair<double, int64_t> run_resumable(std::vector<std::string> args, const std::string& dir,
                                               const std::string& key, int64_t steps, const std::string& label) {
  std::pair<double, int64_t> r = last_eval(dir + "/metrics.jsonl", key);
  if (r.second == steps) return r;
  const bool resume = std::filesystem::exists(dir + "/checkpoint.safetensors");
  args.insert(args.begin() + 1, {"--out-dir", dir});
  if (resume) args.push_back("--resume");
  make_dir(dir);
  std::printf("%s %s (log: %s.log) ...\n", resume ? "resuming" : "running", label.c_str(), dir.c_str());
  const int rc = run_program(args, dir + ".log", /*append=*/resume);
  if (rc == kInterruptedStatus) return {NAN, -1};
  MU_CHECK(rc == 0, args[0], " exited with status ", rc, " for ", label, "; its output is in ", dir, ".log");
  r = last_eval(dir + "/metrics.jsonl", key);
  MU_CHECK(r.second == steps, dir, "/metrics.jsonl holds no evaluation of ", key, " at step ", steps,
           " (the last is at step ", r.second, ")");
  return r;
}

// One model's seed sweep: the trainer `args` (without --out-dir and --seed) with --seed k
// for k < seeds, each into <out-dir>/runs/<flag>-seed<k> (run_once): the evaluations of
// `key`, and a record of every run for the results JSON.
struct Sweep {
  std::vector<double> values;
  nlohmann::json runs = nlohmann::json::array();
};
inline Sweep seed_sweep(const Common& c, const std::string& flag, const std::string& name, int seeds,
                        const std::vector<std::string>& args, const std::string& key) {
  Sweep sweep;
  for (int seed = 0; seed < seeds; ++seed) {
    const std::string dir = c.out_dir + "/runs/" + flag + "-seed" + std::to_string(seed);
    std::vector<std::string> a = args;
    a.insert(a.end(), {"--seed", std::to_string(seed)});
    const auto [value, step] = run_once(a, dir, key, name + " seed " + std::to_string(seed));
    sweep.values.push_back(value);
    sweep.runs.push_back({{"seed", seed}, {key, value}, {"steps", step}, {"dir", dir}});
  }
  return sweep;
}

}  // namespace mu::repro
