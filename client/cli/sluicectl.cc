// sluicectl: the command line of Sluice. Data on stdout, logs on stderr.
// This file: the overview and per-command help, the check that every flag
// belongs to its command, and the dispatch to the commands (one file per
// command group: job_commands.cc, read_command.cc, health_command.cc,
// index_command.cc, coordination_commands.cc, cluster.cc; common.cc).
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/cli.h"

ABSL_DECLARE_FLAG(std::string, coordinator);

namespace sluice::cli {

namespace {

constexpr char kHelpText[] = R"(sluicectl: the Sluice command line.

Usage: sluicectl COMMAND [args] [flags]

Commands:
  demo                      the end-to-end demo (generates data, starts a cluster,
                            kills a trainer and a data server, verifies)
  up                        a local cluster in the foreground (--dir, --shards,
                            --data_servers); Ctrl-C stops every child; --ha:
                            two coordinators on a local etcd (one leads)
  index DIR|GLOB [-o FILE]  scan shards locally into a manifest (JSON)
        [--url_prefix=URL --checksum]   ... for shards published at URL
  index --data_server=HOST:PORT URL... [-o FILE]
                            index (remote) shards through a data server
  job create --name N --manifest FILE [--world_size --epochs --mode --remainder
             --seed --[no]shuffle --shuffle_window --lease_ttl --on_corrupt --pool]
  job create --name N --source name=A,manifest=FILE,weight=0.7 --source ...
             --samples_per_epoch N      a job mixing several datasets
  job create --copy_of JOB --world_size N [--name N]
                            the same data and order for N ranks
  job get NAME | job list | job delete NAME
  status [JOB...]           epoch, per-rank consumed/quota, leases, sessions,
                            live data servers
  audit JOB --epoch E [--rank R --worker W --from N --count K --nokeys]
        [--step S --batch_size B --num_workers K] [--decode_spec TEXT]
                            the samples a reader took in an epoch, in order
  audit JOB --export_dir DIR  every kept epoch of every reader into files
  replay JOB --epoch E (--key K | --rank R --worker W --position N)
         [--decode_spec TEXT] [--out FILE.npy|FILE.png]
                            that sample again, as the trainer got it
  read --job J --rank R [--read_epochs N] [--decode] [--decode_spec TEXT] [--rate N]
       [--stall_timeout 60s]  one JSON line per sample on stdout
  health HOST:PORT [--service readiness]
  once NAME [--scope S --id ID --ttl 10s --fail_all] -- COMMAND [ARGS...]
                            runs COMMAND on exactly one of all callers; the
                            others wait; everyone exits with its status
  barrier NAME --participants N --id ID [--timeout 60s --scope S]
                            returns when N distinct ids arrived; on timeout
                            says which are missing (exit 5)

Common flags: --coordinator=HOST:PORT (default 127.0.0.1:7070), --timeout=10s,
--json, --ca_cert=PEM [--client_cert=PEM --client_key=PEM] for TLS. `sluicectl COMMAND --help` shows a command's usage.

Exit codes: 0 ok; 1 the server refused or a local error (the message says
which); 2 bad command line; 3 coordinator or data server unreachable in time;
4 demo verification failed; 5 barrier timed out; 6 `read` on a job that had
already served all its epochs; `once` exits with the command's status.
)";

}  // namespace
}  // namespace sluice::cli

namespace sluice::cli {
namespace {

// Flags every command takes (and absl's own).
constexpr const char* kCommonFlags[] = {
    "coordinator", "timeout",  "json",    "ca_cert",    "client_cert",
    "client_key",  "flagfile", "fromenv", "tryfromenv", "undefok"};

struct CommandHelp {
  const char* name;
  const char* usage;  // what `sluicectl NAME --help` prints first
  std::vector<const char*> flags;
};

const std::vector<CommandHelp>& Commands() {
  static const auto* commands = new std::vector<CommandHelp>{
      {"demo",
       "sluicectl demo [--dir DIR]\n  The end-to-end demo: generates a "
       "dataset, "
       "starts a local cluster, trains four ranks with two DataLoader-like\n  "
       "workers each, SIGKILLs a trainer and a data server, and verifies every "
       "epoch was read exactly once.",
       {"dir", "demo_samples", "demo_shards"}},
      {"up",
       "sluicectl up [--dir DIR] [--shards DIR] [--data_servers N | "
       "--autoscale MIN:MAX] [--ha] [--coordinator LISTEN] [--listen_host "
       "HOST] [--data_server_flags F,...] [-- COORDINATOR_FLAGS]\n  A local "
       "cluster in the "
       "foreground: a coordinator (--coordinator is its listen address) and "
       "data servers\n  serving --shards; --ha: two coordinators on a local "
       "etcd, one leading. --listen_host=0.0.0.0\n  serves other nodes (every "
       "server binds to it; the coordinator with --coordinator's port). "
       "--autoscale: start and\n  drain data servers to follow the "
       "coordinator's estimate of what the jobs need. Ctrl-C stops every "
       "child.",
       {"dir", "shards", "data_servers", "autoscale", "data_server_flags", "ha",
        "listen_host"}},
      {"index",
       "sluicectl index DIR|GLOB [-o FILE] [--url_prefix URL] [--checksum]\n"
       "sluicectl index --data_server HOST:PORT URL... [-o FILE]\n  Scans "
       "shards into a manifest (JSON): local files, or remote shards through a "
       "data server.",
       {"o", "url_prefix", "checksum", "data_server"}},
      {"job",
       "sluicectl job create --name N --manifest FILE [--world_size --epochs "
       "--mode --remainder --seed --[no]shuffle --lease_ttl --on_corrupt "
       "--max_samples_per_lease --shuffle_window --pool]\n"
       "sluicectl job create --name N --source name=A,manifest=FILE,weight=W "
       "--source name=B,manifest=FILE,weight=W[,on_exhausted=stop] "
       "--samples_per_epoch N [...]\n"
       "  (a source takes weight= or samples=; on_exhausted=repeat|stop)\n"
       "sluicectl job create --copy_of JOB --world_size N [--name NAME]\n"
       "  (JOB's data and order for N ranks; default name JOB.wN)\n"
       "sluicectl job get NAME | job list | job delete NAME\n  Creates, shows "
       "and deletes jobs (create and delete need --admin_token_file on a "
       "secured coordinator).",
       {"name", "manifest", "world_size", "epochs", "mode", "remainder", "seed",
        "shuffle", "lease_ttl", "on_corrupt", "max_samples_per_lease",
        "shuffle_window", "samples_per_epoch", "source", "copy_of", "pool",
        "weight", "tenant", "admin_token_file"}},
      {"status",
       "sluicectl status [JOB...]\n  Per job: epoch, per-rank consumed/quota, "
       "lag behind the most advanced rank, leases, sessions, live data "
       "servers. Given several coordinators "
       "(--coordinator=a,b), first each one's role: leader, standby (naming "
       "the leader) or unreachable. --json: one JSON document, the Job for "
       "one JOB, else a ListJobsResponse (without JOBs: every job and the "
       "fleet: live and wanted data servers, pools).",
       {}},
      {"audit",
       "sluicectl audit JOB --epoch E [--rank R] [--worker W] [--from N] "
       "[--count K] [--nokeys] [--json] [--decode_spec TEXT]\n"
       "sluicectl audit JOB --epoch E [--rank R] --step S --batch_size B "
       "[--num_workers K]\n"
       "sluicectl audit JOB --export_dir DIR\n  The samples reader (R, W) of "
       "JOB "
       "acknowledged in epoch E, in the order its loop took them: position, "
       "key,\n  shard URL, index in the shard, source (jobs with sources), "
       "unit kind and unit. Kept for a job's\n  current epoch and the one "
       "before it. Keys are looked up on a live data server (--nokeys: not).\n"
       "  With the --decode_spec the trainer's reader used, each line also "
       "shows what its transforms\n  drew: the image's size, the crops, "
       "resizes and flips (\"draws\").\n"
       "  --export_dir writes both epochs of every reader to files, to keep "
       "them past the next epoch.",
       {"epoch", "rank", "worker", "from", "count", "keys", "step",
        "batch_size", "num_workers", "export_dir", "rolled_back",
        "decode_spec"}},
      {"replay",
       "sluicectl replay JOB --epoch E (--key K | --rank R [--worker W] "
       "--position N) [--decode_spec TEXT | --decode] [--data_server "
       "HOST:PORT] [--out FILE.npy|FILE.png [--field NAME]]\n  Serves one "
       "sample of an epoch again with the augmentation draws it got then "
       "(give the --decode_spec\n  the trainer's reader used): its tensor is "
       "the one the trainer received. Prints a JSON sidecar\n  (where it "
       "came from, the crops, resizes and flips drawn, its fields); --out "
       "writes the tensor\n  and the sidecar to FILE.json.",
       {"epoch", "rank", "worker", "position", "key", "decode_spec", "decode",
        "data_server", "out", "field"}},
      {"read",
       "sluicectl read --job J [--rank R] [--read_epochs N] [--decode] "
       "[--decode_spec TEXT] [--rate N]\n  Reads a job as one trainer rank "
       "would, one JSON line per sample on stdout.",
       {"job", "rank", "worker", "workers", "read_epochs", "decode",
        "decode_spec", "rate", "trainer_id", "progress_interval",
        "stall_timeout"}},
      {"health",
       "sluicectl health HOST:PORT [--service readiness] [--wait]\n  The "
       "gRPC health status of a server (or of one of its services); with "
       "--wait, once it is SERVING or --timeout has passed.",
       {"service", "wait"}},
      {"once",
       "sluicectl once NAME [--scope S --id ID --ttl 10s --fail_all] -- "
       "COMMAND "
       "[ARGS...]\n  Runs COMMAND on exactly one of all callers; the others "
       "wait; everyone exits with its status.\n"
       "sluicectl once --list [SCOPE]\n  The steps the coordinator remembers "
       "as done or failed, and those running now.\n"
       "sluicectl once --reset NAME [--scope S]\n  Forgets a finished step, "
       "so that its next caller runs it again (needs --admin_token_file on a "
       "secured coordinator).",
       {"scope", "id", "ttl", "fail_all", "list", "reset", "admin_token_file"}},
      {"barrier",
       "sluicectl barrier NAME --participants N --id ID [--timeout 60s --scope "
       "S]\n  Returns when N distinct ids arrived; on timeout says which are "
       "missing (exit 5).",
       {"participants", "id", "scope"}},
  };
  return *commands;
}

// The candidate nearest to `word` by edit distance (adjacent letters
// swapped count as one edit), if close enough to be a typo: 1 edit for
// words of up to 3 letters, 2 beyond; "" if none.
std::string Nearest(const std::string& word,
                    const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = (word.size() <= 3 ? 1 : 2) + 1;
  for (const std::string& c : candidates) {
    // Optimal string alignment distance over the whole table.
    std::vector<std::vector<size_t>> d(word.size() + 1,
                                       std::vector<size_t>(c.size() + 1));
    for (size_t i = 0; i <= word.size(); ++i) d[i][0] = i;
    for (size_t j = 0; j <= c.size(); ++j) d[0][j] = j;
    for (size_t i = 1; i <= word.size(); ++i) {
      for (size_t j = 1; j <= c.size(); ++j) {
        d[i][j] =
            std::min({d[i - 1][j] + 1, d[i][j - 1] + 1,
                      d[i - 1][j - 1] + (word[i - 1] == c[j - 1] ? 0 : 1)});
        if (i > 1 && j > 1 && word[i - 1] == c[j - 2] &&
            word[i - 2] == c[j - 1]) {
          d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
      }
    }
    if (d[word.size()][c.size()] < best_distance) {
      best_distance = d[word.size()][c.size()];
      best = c;
    }
  }
  return best;
}

// " (did you mean X?)" or "".
std::string DidYouMean(const std::string& word,
                       const std::vector<std::string>& candidates,
                       const std::string& prefix = "") {
  const std::string nearest = Nearest(word, candidates);
  return nearest.empty()
             ? std::string()
             : absl::StrCat(" (did you mean ", prefix, nearest, "?)");
}

const CommandHelp* FindCommand(const std::string& name) {
  for (const CommandHelp& c : Commands()) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

void PrintFlag(const char* name) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  if (flag == nullptr) return;
  std::printf(
      "  --%s  %s (default: %s)\n", name, flag->Help().c_str(),
      flag->DefaultValue().empty() ? "\"\"" : flag->DefaultValue().c_str());
}

int CommandUsage(const CommandHelp& c) {
  std::printf("%s\n\nFlags:\n", c.usage);
  for (const char* f : c.flags) PrintFlag(f);
  std::printf("\nCommon flags:\n");
  for (const char* f : kCommonFlags) {
    if (std::string(f).find("env") == std::string::npos &&
        std::string(f) != "flagfile" && std::string(f) != "undefok") {
      PrintFlag(f);
    }
  }
  std::printf(
      "\nExit codes: 0 ok; 1 refused or a local error; 2 bad command line; 3 "
      "unreachable; see sluicectl --help.\n");
  return kOk;
}

// The flags named on the command line before a `--`, and the command (the
// first argument that is neither a flag nor a flag's value). INVALID_ARGUMENT
// for a flag sluicectl does not have.
absl::Status ScanCommandLine(int argc, char** argv, std::string* command,
                             std::string* subcommand,
                             std::vector<std::string>* flags) {
  bool value_next = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") break;
    if (value_next) {
      value_next = false;
      continue;
    }
    if (a.size() < 2 || a[0] != '-') {
      if (command->empty()) {
        *command = a;
      } else if (subcommand->empty()) {
        *subcommand = a;
      }
      continue;
    }
    std::string name = a.substr(a[1] == '-' ? 2 : 1);
    const size_t eq = name.find('=');
    const bool has_value = eq != std::string::npos;
    if (has_value) name.resize(eq);
    // Abseil's own usage flags (--helpfull, --version ...): absl handles them.
    static const char* const kUsageFlags[] = {
        "helpfull",  "helpshort", "helppackage",    "helpon",
        "helpmatch", "version",   "only_check_args"};
    if (std::find(std::begin(kUsageFlags), std::end(kUsageFlags), name) !=
        std::end(kUsageFlags)) {
      continue;
    }
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && name.rfind("no", 0) == 0) {
      const absl::CommandLineFlag* negated =
          absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) {
        flag = negated;
        name = name.substr(2);
      }
    }
    if (flag == nullptr) {
      // Suggest among the command's flags and the common ones (every
      // command's when no command is known yet).
      std::vector<std::string> known(std::begin(kCommonFlags),
                                     std::end(kCommonFlags));
      for (const CommandHelp& c : Commands()) {
        if (!command->empty() && *command != c.name) continue;
        known.insert(known.end(), c.flags.begin(), c.flags.end());
      }
      const std::string hint = DidYouMean(name, known, "--");
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown flag --", name,
          !hint.empty()      ? hint
          : command->empty() ? std::string()
                             : absl::StrCat(" (sluicectl ", *command,
                                            " --help lists its flags)")));
    }
    if (!has_value && !flag->IsOfType<bool>()) value_next = true;
    flags->push_back(name);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace sluice::cli

namespace {
int Run(int argc, char** argv) {
  using namespace sluice::cli;
  // `sluicectl`, `sluicectl --help`: the overview; `sluicectl CMD --help`:
  // that command's usage and flags.
  bool help = argc < 2;
  std::string help_command;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") break;  // the rest belongs to `once`'s command
    if (a == "--help" || a == "-h" || a == "help") {
      help = true;
    } else if (help_command.empty() && !a.empty() && a[0] != '-') {
      help_command = a;
    }
  }
  if (help) {
    if (const CommandHelp* c = FindCommand(help_command)) {
      return CommandUsage(*c);
    }
    std::fputs(kHelpText, stdout);
    return argc < 2 ? kUsage : kOk;
  }
  // --source may repeat, and its value holds commas: take every one out
  // before the flags are parsed (only `job create` takes it).
  std::vector<char*> argv_kept(argv, argv + argc);
  for (size_t i = 1; i < argv_kept.size();) {
    const std::string a = argv_kept[i];
    if (a == "--") break;
    if (a == "--source" || a == "-source") {
      if (i + 1 >= argv_kept.size()) return Usage("--source needs a value");
      SourceArgs().push_back(argv_kept[i + 1]);
      argv_kept.erase(argv_kept.begin() + static_cast<std::ptrdiff_t>(i),
                      argv_kept.begin() + static_cast<std::ptrdiff_t>(i) + 2);
    } else if (absl::StartsWith(a, "--source=") ||
               absl::StartsWith(a, "-source=")) {
      SourceArgs().push_back(a.substr(a.find('=') + 1));
      argv_kept.erase(argv_kept.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  argc = static_cast<int>(argv_kept.size());
  argv_kept.push_back(nullptr);
  argv = argv_kept.data();
  if (!SourceArgs().empty()) {
    std::vector<std::string> words;
    for (int i = 1; i < argc && words.size() < 2; ++i)
      if (argv[i][0] != '-') words.push_back(argv[i]);
    if (words.size() < 2 || words[0] != "job" || words[1] != "create")
      return Usage("--source applies to `job create` only");
  }
  // Every flag must exist and belong to the command it is given to.
  {
    std::string command, subcommand;
    std::vector<std::string> flags;
    if (absl::Status scanned =
            ScanCommandLine(argc, argv, &command, &subcommand, &flags);
        !scanned.ok()) {
      return Usage(std::string(scanned.message()));
    }
    if (const CommandHelp* c = FindCommand(command)) {
      for (const std::string& f : flags) {
        const bool common =
            std::any_of(std::begin(kCommonFlags), std::end(kCommonFlags),
                        [&](const char* k) { return f == k; });
        // Of `job`, only `create` takes the job spec's flags.
        const bool own = std::any_of(c->flags.begin(), c->flags.end(),
                                     [&](const char* k) { return f == k; }) &&
                         (command != "job" || subcommand == "create" ||
                          f == "admin_token_file");
        if (!common && !own) {
          const std::string what =
              command == "job" ? absl::StrCat("job ", subcommand) : command;
          return Usage(absl::StrCat("--", f, " does not apply to `", what,
                                    "` (sluicectl ", command,
                                    " --help lists its flags)"));
        }
      }
    }
  }
  absl::FlagsUsageConfig config;
  config.contains_helpshort_flags = [](absl::string_view) { return false; };
  config.contains_help_flags = [](absl::string_view f) {
    return absl::StrContains(f, "client/cli");
  };
  config.version_string = [] { return std::string("sluicectl 0.1.0\n"); };
  // Repository-relative file names in --helpfull, not this build's paths.
  config.normalize_filename = [](absl::string_view file) {
    for (absl::string_view root : {"client/", "server/", "absl/"}) {
      const size_t at = file.find(root);
      if (at != absl::string_view::npos) return std::string(file.substr(at));
    }
    return std::string(file);
  };
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(kHelpText);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() < 2) return Usage("no command");
  if (absl::Status creds = LoadCredentials(); !creds.ok())
    return Usage(std::string(creds.message()));
  const std::string command = positional[1];
  std::vector<std::string> args(positional.begin() + 2, positional.end());
  // --coordinator defaults to $SLUICE_COORDINATOR, as in the Python client:
  // where commands call it, and where `up` starts it (`demo` always starts
  // its own on --coordinator).
  if (command != "demo") {
    const char* env = std::getenv("SLUICE_COORDINATOR");
    const absl::CommandLineFlag* flag =
        absl::FindCommandLineFlag("coordinator");
    if (env != nullptr && *env != '\0' && flag != nullptr &&
        flag->CurrentValue() == flag->DefaultValue()) {
      absl::SetFlag(&FLAGS_coordinator, env);
    }
  }
  if (command == "job") return JobCommand(args);
  if (command == "status") return StatusCommand(args);
  if (command == "read") return ReadCommand(args);
  if (command == "health") return HealthCommand(args);
  if (command == "index") return IndexCommand(args);
  if (command == "up") return UpCommand(args);
  if (command == "demo") return DemoCommand(args);
  if (command == "once") return OnceCommand(args);
  if (command == "barrier") return BarrierCommand(args);
  if (command == "audit") return AuditCommand(args);
  if (command == "replay") return ReplayCommand(args);
  std::vector<std::string> names;
  for (const CommandHelp& c : Commands()) names.push_back(c.name);
  return Usage("unknown command \"" + command + "\"" +
               DidYouMean(command, names));
}
}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  const int code = Run(argc, argv);
  // Every command has stopped what it started by now. gRPC's background
  // threads outlive the last channel, and running static destructors under
  // them can crash after the output was written (a SIGSEGV seen once at the
  // exit of `health`): flush and leave without them.
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}
