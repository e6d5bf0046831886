// Shared pieces of sluicectl: exit codes, output helpers, the subcommands.
#ifndef SLUICE_CLIENT_CLI_CLI_H_
#define SLUICE_CLIENT_CLI_CLI_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "sluice/tls.h"
#include "sluice/v1/coordinator.grpc.pb.h"
#include "sluice/v1/dataserver.pb.h"

namespace sluice::cli {

// Documented in `sluicectl --help` and the README.
enum ExitCode {
  kOk = 0,
  kError = 1,         // the server refused (message says why) or a local error
  kUsage = 2,         // bad command line
  kUnreachable = 3,   // coordinator / data server not reachable in time
  kVerifyFailed = 4,  // `demo`: the verification did not hold
  kBarrierTimeout = 5,  // `barrier`: not everyone arrived in time
  kJobDone = 6          // `read`: the job had already served all its epochs
};

// Prints "sluicectl: <message>" to stderr and returns the exit code that
// fits the status.
int Fail(const absl::Status& status);
int Usage(const std::string& message);
std::unique_ptr<v1::Coordinator::Stub> CoordinatorStub(
    const std::string& address);
// Channel credentials from --ca_cert / --client_cert / --client_key
// (insecure when --ca_cert is empty), loaded once by main().
std::shared_ptr<grpc::ChannelCredentials> Credentials();
// The TLS of --ca_cert / --client_cert / --client_key, or none for
// plaintext (as ReaderOptions, OnceOptions and BarrierOptions take it).
std::optional<ClientTls> ClientTlsOrNone();
absl::Status LoadCredentials();
// A context with the --timeout deadline. With `wait_for_ready`, a call to a
// coordinator that is not listening yet waits for it until the deadline.
std::unique_ptr<grpc::ClientContext> Deadline(bool wait_for_ready = true);
// A coordinator call's status as sluicectl reports it: `what` first; an
// unreachable coordinator named (and a TLS mismatch explained).
absl::Status Rpc(const grpc::Status& s, const std::string& what);
// A message as indented JSON with the proto field names.
std::string ToJson(const google::protobuf::Message& m);

// An audited or replayed sample's draws as the JSON keys source_size,
// steps, flip_horizontal and flip_vertical (client/README.md), added to
// `out`; nothing when nothing was drawn.
void AddDrawsJson(const v1::SampleDraws& draws, nlohmann::ordered_json& out);
// The same as one word: "WxH" then ":crop(l,t,w,h)", ":resize(w,h)",
// ":hflip", ":vflip" in order; "-" when nothing was drawn.
std::string DrawsWord(const v1::SampleDraws& draws);

// Subcommands; `args` are the positional words after the subcommand name.
int JobCommand(const std::vector<std::string>& args);
// The values of every --source flag (job create), in order.
std::vector<std::string>& SourceArgs();
int StatusCommand(const std::vector<std::string>& args);
int ReadCommand(const std::vector<std::string>& args);
int HealthCommand(const std::vector<std::string>& args);
int IndexCommand(const std::vector<std::string>& args);
int UpCommand(const std::vector<std::string>& args);
int DemoCommand(const std::vector<std::string>& args);
int OnceCommand(const std::vector<std::string>& args);
int BarrierCommand(const std::vector<std::string>& args);
int AuditCommand(const std::vector<std::string>& args);
int ReplayCommand(const std::vector<std::string>& args);

}  // namespace sluice::cli

#endif  // SLUICE_CLIENT_CLI_CLI_H_
