// `protein prepare` (prepare.h): read and check the FASTA, cluster it with mmseqs2 (run as a
// subprocess in a temporary folder), split by clusters or at random, write the folder atomically.
// Not here: reading the folder back, masking, batching (dataset.h).
#include "prepare.h"
#include "apps/common/run_options.h"

#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <ostream>
#include <set>
#include <sstream>
#include <unordered_set>

#include "alphabet.h"
#include "apps/common/metrics.h"
#include "apps/common/prepared_data.h"
#include "core/error.h"
#include "nn/io_util.h"
#include "nn/readers.h"
#include "nn/sampler.h"

extern char** environ;

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace protein {

void add_prepare_flags(CLI::App& app, PrepareOptions& o) {
  const char* data = "Data";
  app.add_option("--out", o.out, "folder to write (replaced only if it holds a prepared data.json)")
      ->group(data)->capture_default_str();
  app.add_option("--fasta", o.fasta, "protein sequences, FASTA or FASTA.gz (residues " + std::string(kResidueChars) +
                 ", upper case)")->group(data)->capture_default_str();
  app.add_option("--query", o.query, "extra evaluation sequences written as query.fasta, not split (\"\": none)")
      ->group(data)->capture_default_str();
  const char* split = "Split";
  app.add_option("--split", o.split, "cluster: whole mmseqs2 clusters per split; random: sequences at random")
      ->group(split)->capture_default_str()->check(CLI::IsMember({"cluster", "random"}));
  app.add_option("--valid-size", o.valid_size,
                 "sequences in the validation set (cluster split: at least, whole "
                 "clusters)")
      ->group(split)
      ->capture_default_str()
      ->check(linea::apps::non_negative_number());
  app.add_option("--test-size", o.test_size, "sequences in the test set (cluster split: at least, whole clusters)")
      ->group(split)
      ->capture_default_str()
      ->check(linea::apps::non_negative_number());
  app.add_option("--seed", o.seed, "seed of the cluster order or of the random split")
      ->group(split)
      ->capture_default_str()
      ->check(linea::apps::non_negative_number());
  const char* clu = "Clustering (mmseqs2 easy-cluster)";
  app.add_option("--min-seq-id", o.min_seq_id, "sequence identity of a cluster member to its representative")
      ->group(clu)
      ->capture_default_str()
      ->check(linea::apps::finite_range(0.0, 1.0));
  app.add_option("--coverage", o.coverage, "aligned fraction of both sequences (mmseqs -c)")
      ->group(clu)
      ->capture_default_str()
      ->check(linea::apps::finite_range(0.0, 1.0));
  app.add_option("--mmseqs", o.mmseqs, "the mmseqs executable (Debian package mmseqs2)")
      ->group(clu)->capture_default_str();
  app.add_option("--threads", o.threads, "mmseqs threads (0: all cores)")
      ->group(clu)
      ->capture_default_str()
      ->check(linea::apps::non_negative_number());
}

namespace {

const char* kOp = "protein prepare";

// A FASTA file's records with their residue ids, every record checked against the alphabet.
struct Records {
  std::vector<linea::nn::FastaRecord> fasta;
  std::vector<std::vector<int8_t>> residues;
};

Records read_records(const std::string& path, const char* flag, const char* package) {
  LINEA_CHECK(fs::exists(path), kOp, ": ", flag, " '", path, "' does not exist",
              package ? std::string("; the default comes with `apt-get install ") + package + "`" : std::string());
  Records r;
  r.fasta = linea::nn::read_fasta(path);
  std::unordered_set<std::string> ids;
  for (size_t k = 0; k < r.fasta.size(); ++k) {
    const linea::nn::FastaRecord& rec = r.fasta[k];
    const std::string name = "'" + path + "': record " + std::to_string(k + 1) + " '" + rec.id + "'";
    r.residues.push_back(encode_residues(rec.sequence, std::string(kOp) + " " + flag + " " + name));
    // clusters.tsv and the split files name sequences by id, so an id must name one sequence.
    LINEA_CHECK(ids.insert(rec.id).second, kOp, ": ", flag, " ", name, ": the id is used by an earlier record too "
                "(ids, the first word of a header, must be unique)");
  }
  return r;
}

void write_file(const fs::path& path, const std::string& bytes) {
  linea::nn::detail::write_file_atomic(path.string(), bytes, kOp);
}

// The last `max_lines` lines of a log file (a progress bar's '\r' redraws count as line ends).
std::string log_tail(const std::string& path, size_t max_lines = 15) {
  std::string text;
  try {
    const std::vector<char> bytes = linea::nn::detail::read_file_bytes(path, kOp);
    text.assign(bytes.begin(), bytes.end());
  } catch (const linea::Error&) {
    return " (no log)";
  }
  std::replace(text.begin(), text.end(), '\r', '\n');
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) lines.push_back(l);
  if (lines.empty()) return " (empty log)";
  const size_t first = lines.size() > max_lines ? lines.size() - max_lines : 0;
  std::string out;
  for (size_t i = first; i < lines.size(); ++i) out += "\n  | " + lines[i];
  return out;
}

// Runs argv (argv[0] searched on PATH) with stdin from /dev/null and stdout + stderr into
// log_path; returns the exit status (128 + the signal when killed). A program that cannot be
// started is a linea::Error that says how to install mmseqs2.
int run_logged(const std::vector<std::string>& argv, const std::string& log_path) {
  const auto not_found = [&](const std::string& why) {
    LINEA_FAIL(kOp, ": cannot run '", argv[0], "' (", why, "); install mmseqs2 with `apt-get install mmseqs2`, or "
               "give the executable's path with --mmseqs");
  };
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) not_found(std::strerror(rc));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    LINEA_CHECK(errno == EINTR, kOp, ": waiting for '", argv[0], "' failed: ", std::strerror(errno));
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
  // 127: the shell convention (and some C libraries') for an executable that could not be run.
  if (code == 127) not_found("exit status 127: not found or not executable;" + log_tail(log_path, 3));
  return code;
}

std::string join_args(const std::vector<std::string>& argv) {
  std::string s;
  for (const std::string& a : argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

// What clustering gives: each sequence's representative (an index into the input).
struct Clustering {
  std::vector<int64_t> rep;
  std::string command, version;
};

// Parses <prefix>_cluster.tsv, whose ids are our 0-based indices: every sequence must be listed
// exactly once, with a representative that represents itself.
std::vector<int64_t> read_cluster_tsv(const std::string& path, int64_t n) {
  const std::vector<char> bytes = linea::nn::detail::read_file_bytes(path, kOp);
  std::vector<int64_t> rep(static_cast<size_t>(n), -1);
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  int64_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.empty()) continue;
    const auto parse = [&](const std::string& s) -> int64_t {
      const bool digits = !s.empty() && s.size() < 19 &&
                          std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
      LINEA_CHECK(digits && std::stoll(s) < n, kOp, ": mmseqs output '", path, "' line ", line_no, ": unexpected id '",
                  s, "' (expected an index below ", n, ")");
      return std::stoll(s);
    };
    const size_t tab = line.find('\t');
    LINEA_CHECK(tab != std::string::npos, kOp, ": mmseqs output '", path, "' line ", line_no,
                ": expected 'representative<TAB>member', got '", line, "'");
    const int64_t r = parse(line.substr(0, tab)), m = parse(line.substr(tab + 1));
    LINEA_CHECK(rep[m] < 0, kOp, ": mmseqs output '", path, "' lists sequence ", m, " twice");
    rep[m] = r;
  }
  for (int64_t i = 0; i < n; ++i) {
    LINEA_CHECK(rep[i] >= 0, kOp, ": mmseqs output '", path, "' does not list sequence ", i, " of ", n);
    LINEA_CHECK(rep[rep[i]] == rep[i], kOp, ": mmseqs output '", path, "': representative ", rep[i],
                " is itself in another cluster");
  }
  return rep;
}

// mmseqs easy-cluster on the records, in `work`. Headers are replaced by the records' 0-based
// indices, so the output maps back without parsing ids the way mmseqs does.
Clustering run_mmseqs(const Records& in, const PrepareOptions& o, const fs::path& work, std::ostream* log) {
  Clustering c;
  const std::string version_log = (work / "version.log").string();
  const int vcode = run_logged({o.mmseqs, "version"}, version_log);
  LINEA_CHECK(vcode == 0, kOp, ": `", o.mmseqs, " version` failed (exit status ", vcode, "):", log_tail(version_log));
  const std::vector<char> v = linea::nn::detail::read_file_bytes(version_log, kOp);
  c.version.assign(v.begin(), std::find(v.begin(), v.end(), '\n'));  // e.g. "14.7e284"

  std::string fasta;
  for (size_t i = 0; i < in.fasta.size(); ++i) fasta += ">" + std::to_string(i) + "\n" + in.fasta[i].sequence + "\n";
  write_file(work / "input.fasta", fasta);
  fs::create_directory(work / "tmp");
  const auto num = [](double x) { return json(x).dump(); };  // shortest round trip: 0.5, 0.8
  std::vector<std::string> tail = {"--min-seq-id", num(o.min_seq_id), "-c", num(o.coverage)};
  if (o.threads > 0) tail.insert(tail.end(), {"--threads", std::to_string(o.threads)});
  std::vector<std::string> argv = {o.mmseqs, "easy-cluster", (work / "input.fasta").string(), (work / "clu").string(),
                                   (work / "tmp").string()};
  argv.insert(argv.end(), tail.begin(), tail.end());
  // data.json records the command with the folder-independent names, so reruns are identical.
  std::vector<std::string> shown = {o.mmseqs, "easy-cluster", "input.fasta", "clu", "tmp"};
  shown.insert(shown.end(), tail.begin(), tail.end());
  c.command = join_args(shown);
  if (log) *log << "clustering " << in.fasta.size() << " sequences: " << c.command << " ..." << std::endl;
  const std::string run_log = (work / "mmseqs.log").string();
  const int code = run_logged(argv, run_log);
  LINEA_CHECK(code == 0, kOp, ": `", join_args(argv), "` failed (exit status ", code, "); the end of its output:",
              log_tail(run_log));
  c.rep = read_cluster_tsv((work / "clu_cluster.tsv").string(), static_cast<int64_t>(in.fasta.size()));
  return c;
}

std::string fasta_text(const Records& r, const std::vector<int64_t>& which) {
  std::string s;
  for (int64_t i : which) {
    const linea::nn::FastaRecord& rec = r.fasta[i];
    s += ">" + rec.id + (rec.description.empty() ? "" : " " + rec.description) + "\n" + rec.sequence + "\n";
  }
  return s;
}

// Sequence indices of train, valid, test, each in input order.
std::vector<std::vector<int64_t>> make_splits(const std::vector<int64_t>& cluster_of, int64_t num_clusters,
                                              const PrepareOptions& o) {
  const int64_t n = static_cast<int64_t>(cluster_of.size());
  std::vector<std::vector<int64_t>> s(3);
  if (o.split == "random") {
    const std::vector<int64_t> perm = linea::nn::epoch_permutation(n, o.seed, 0);
    for (int64_t k = 0; k < n; ++k) s[k < o.valid_size ? 1 : k < o.valid_size + o.test_size ? 2 : 0].push_back(perm[k]);
  } else {
    // Whole clusters in a seeded order: test fills first, then valid, the rest is train.
    std::vector<int> role(static_cast<size_t>(num_clusters), 0);
    int64_t test = 0, valid = 0;
    std::vector<int64_t> size(static_cast<size_t>(num_clusters), 0);
    for (int64_t c : cluster_of) ++size[c];
    for (int64_t c : linea::nn::epoch_permutation(num_clusters, o.seed, 0)) {
      if (test < o.test_size) {
        role[c] = 2;
        test += size[c];
      } else if (valid < o.valid_size) {
        role[c] = 1;
        valid += size[c];
      }
    }
    for (int64_t i = 0; i < n; ++i) s[role[cluster_of[i]]].push_back(i);
    LINEA_CHECK(!s[0].empty(), kOp, ": the cluster split's test (", test, ") and valid (", valid, ") sequences, "
                "whole clusters, took all ", n, " sequences; lower --valid-size / --test-size");
  }
  for (auto& v : s) std::sort(v.begin(), v.end());
  return s;
}

std::string sequence_key(const std::vector<int8_t>& r) { return std::string(r.begin(), r.end()); }

PrepareResult prepare_folder(const PrepareOptions& o, std::ostream* log) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto say = [&](const std::string& s) {
    if (log) *log << s << std::endl;
  };
  LINEA_CHECK(o.split == "cluster" || o.split == "random", kOp, ": --split must be cluster or random, got '", o.split,
              "'");
  LINEA_CHECK(o.valid_size >= 0 && o.test_size >= 0, kOp, ": --valid-size and --test-size must be >= 0, got ",
              o.valid_size, " and ", o.test_size);
  LINEA_CHECK(o.min_seq_id >= 0 && o.min_seq_id <= 1 && o.coverage >= 0 && o.coverage <= 1, kOp,
              ": --min-seq-id and --coverage must be in [0, 1], got ", o.min_seq_id, " and ", o.coverage);
  LINEA_CHECK(o.threads >= 0, kOp, ": --threads must be >= 0, got ", o.threads);
  LINEA_CHECK(!o.mmseqs.empty(), kOp, ": --mmseqs is empty");
  const std::string out_str = linea::apps::prepared_data_out(kOp, o.out);
  const fs::path out(out_str);

  say("reading " + o.fasta + " ...");
  const bool default_fasta = o.fasta == kDefaultFasta, default_query = o.query == kDefaultQuery;
  const Records in = read_records(o.fasta, "--fasta", default_fasta ? "mmseqs2-examples" : nullptr);
  Records query;
  if (!o.query.empty()) query = read_records(o.query, "--query", default_query ? "mmseqs2-examples" : nullptr);
  const int64_t n = static_cast<int64_t>(in.fasta.size());
  LINEA_CHECK(o.valid_size + o.test_size < n, kOp, ": --valid-size ", o.valid_size, " + --test-size ", o.test_size,
              " leaves no training sequences out of the ", n, " in '", o.fasta, "'");

  if (out.has_parent_path()) fs::create_directories(out.parent_path());
  Clustering clu;
  {
    linea::nn::StagingDir work(out_str + ".mmseqs." + std::to_string(::getpid()));
    clu = run_mmseqs(in, o, work.path(), log);
  }

  // Clusters numbered by their representative's position in the input.
  std::vector<int64_t> reps(clu.rep);
  std::sort(reps.begin(), reps.end());
  reps.erase(std::unique(reps.begin(), reps.end()), reps.end());
  const int64_t num_clusters = static_cast<int64_t>(reps.size());
  std::vector<int64_t> cluster_of(static_cast<size_t>(n)), cluster_size(static_cast<size_t>(num_clusters), 0);
  for (int64_t i = 0; i < n; ++i) {
    cluster_of[i] = std::lower_bound(reps.begin(), reps.end(), clu.rep[i]) - reps.begin();
    ++cluster_size[cluster_of[i]];
  }
  const int64_t largest = *std::max_element(cluster_size.begin(), cluster_size.end());
  const int64_t singletons = std::count(cluster_size.begin(), cluster_size.end(), 1);
  say("mmseqs " + clu.version + ": " + std::to_string(num_clusters) + " clusters, largest " + std::to_string(largest) +
      ", " + std::to_string(singletons) + " singletons");

  const std::vector<std::vector<int64_t>> split_idx = make_splits(cluster_of, num_clusters, o);
  std::vector<bool> cluster_in_train(static_cast<size_t>(num_clusters), false);
  std::unordered_set<std::string> train_seqs;
  for (int64_t i : split_idx[0]) {
    cluster_in_train[cluster_of[i]] = true;
    train_seqs.insert(sequence_key(in.residues[i]));
  }

  say("writing " + out_str + " ...");
  linea::nn::StagingDir tmp(out_str + ".tmp." + std::to_string(::getpid()));
  const char* names[3] = {"train", "valid", "test"};
  json splits, files;
  int64_t sizes[3] = {0, 0, 0};
  for (int s = 0; s < 3; ++s) {
    const std::vector<int64_t>& idx = split_idx[s];
    std::vector<int64_t> lengths;
    std::set<int64_t> clusters;
    int64_t residues = 0, mates = 0, identical = 0;
    for (int64_t i : idx) {
      lengths.push_back(static_cast<int64_t>(in.residues[i].size()));
      residues += lengths.back();
      clusters.insert(cluster_of[i]);
      mates += cluster_in_train[cluster_of[i]];
      identical += train_seqs.count(sequence_key(in.residues[i])) > 0;
    }
    sizes[s] = static_cast<int64_t>(idx.size());
    json st = {{"sequences", sizes[s]}, {"residues", residues}, {"clusters", clusters.size()},
               {"length", linea::apps::length_summary(lengths)}};
    if (s > 0) {
      st["with_cluster_mate_in_train"] = mates;
      st["identical_in_train"] = identical;
    }
    splits[names[s]] = st;
    files[names[s]] = std::string(names[s]) + ".fasta";
    write_file(tmp.path() / (std::string(names[s]) + ".fasta"), fasta_text(in, idx));
  }
  const int64_t nq = static_cast<int64_t>(query.fasta.size());
  if (!o.query.empty()) {
    std::vector<int64_t> idx(static_cast<size_t>(nq)), lengths;
    int64_t residues = 0, identical = 0;
    for (int64_t i = 0; i < nq; ++i) {
      idx[i] = i;
      lengths.push_back(static_cast<int64_t>(query.residues[i].size()));
      residues += lengths.back();
      identical += train_seqs.count(sequence_key(query.residues[i])) > 0;
    }
    splits["query"] = {{"sequences", nq}, {"residues", residues}, {"length", linea::apps::length_summary(lengths)},
                       {"identical_in_train", identical}};
    files["query"] = "query.fasta";
    write_file(tmp.path() / "query.fasta", fasta_text(query, idx));
  }
  std::string tsv;
  for (int64_t i = 0; i < n; ++i) tsv += in.fasta[clu.rep[i]].id + "\t" + in.fasta[i].id + "\n";
  write_file(tmp.path() / "clusters.tsv", tsv);
  files["clusters"] = "clusters.tsv";

  // The training split's residue frequencies, for the unigram baseline.
  std::vector<int64_t> counts(kNumResidueTokens, 0);
  for (int64_t i : split_idx[0])
    for (int8_t r : in.residues[i]) ++counts[r - kFirstResidue];
  int64_t total_residues = 0;
  for (const std::vector<int8_t>& r : in.residues) total_residues += static_cast<int64_t>(r.size());
  json residue_counts = json::object();
  for (int64_t k = 0; k < kNumResidueTokens; ++k) residue_counts[std::string(1, kResidueChars[k])] = counts[k];

  json split = {{"method", o.split}, {"seed", o.seed}, {"valid_size", o.valid_size}, {"test_size", o.test_size}};
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  json data = {{"format", kDataFormat},
               {"inputs", {{"fasta", o.fasta}, {"sequences", n}, {"residues", total_residues}, {"query", o.query},
                           {"query_sequences", nq}}},
               {"split", split},
               {"mmseqs", {{"command", clu.command}, {"version", clu.version}, {"min_seq_id", o.min_seq_id},
                           {"coverage", o.coverage}, {"threads", o.threads}}},
               {"clusters", {{"count", num_clusters}, {"largest", largest}, {"singletons", singletons}}},
               {"files", files},
               {"splits", splits},
               {"residue_counts", residue_counts},
               {"seconds", std::round(seconds * 10) / 10}};
  write_file(tmp.path() / "data.json", data.dump(2) + "\n");  // last: a folder with data.json is complete
  tmp.install(out);

  PrepareResult r;
  r.out = out_str;
  r.train = sizes[0];
  r.valid = sizes[1];
  r.test = sizes[2];
  r.query = nq;
  r.seconds = seconds;
  r.data = std::move(data);
  return r;
}

}  // namespace

PrepareResult prepare(const PrepareOptions& options, std::ostream* log) {
  return linea::apps::naming_filesystem_errors(kOp, [&] { return prepare_folder(options, log); });
}

std::string describe(const PrepareResult& r) {
  const json& d = r.data;
  std::ostringstream s;
  s << "wrote " << r.out << " (" << d.at("split").at("method").get<std::string>() << " split, seed "
    << d.at("split").at("seed") << "):\n";
  for (const char* name : {"train", "valid", "test", "query"}) {
    if (!d.at("splits").contains(name)) continue;
    const json& st = d.at("splits").at(name);
    s << "  " << name << std::string(7 - std::strlen(name), ' ') << st.at("sequences") << " sequences, "
      << st.at("residues") << " residues, length mean " << st.at("length").at("mean") << " max "
      << st.at("length").at("max");
    if (st.contains("with_cluster_mate_in_train"))
      s << "; " << st.at("with_cluster_mate_in_train") << " with a cluster-mate in train";
    if (st.contains("identical_in_train") && st.at("identical_in_train").get<int64_t>() > 0)
      s << ", " << st.at("identical_in_train") << " identical to a train sequence";
    s << "\n";
  }
  const json& c = d.at("clusters");
  s << "  mmseqs2 " << d.at("mmseqs").at("version").get<std::string>() << " (min-seq-id "
    << d.at("mmseqs").at("min_seq_id") << ", coverage " << d.at("mmseqs").at("coverage") << "): " << c.at("count")
    << " clusters, largest " << c.at("largest") << ", " << c.at("singletons") << " singletons\n";
  s << std::fixed;
  s.precision(1);
  s << "  " << r.seconds << " s\n";
  return s.str();
}

}  // namespace protein
