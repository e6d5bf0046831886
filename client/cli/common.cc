// What every sluicectl command shares: the common flags, errors and exit
// codes, credentials, coordinator stubs and deadlines, JSON of messages.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cli/cli.h"
#include "server/common/grpc_status.h"
#include "server/common/grpc_target.h"
#include "server/common/lease_token.h"
#include "server/common/status_macros.h"
#include "server/common/tls_files.h"
#include "server/common/tls_probe.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7070",
          "Coordinator HOST:PORT, or several IPv4 HOST:PORTs comma-separated "
          "(calls go to the ready one: with an etcd journal, the leader). "
          "Default: $SLUICE_COORDINATOR when set.");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(10), "Deadline of each RPC.");
ABSL_FLAG(bool, json, false, "Print data as JSON.");
ABSL_FLAG(
    std::string, admin_token_file, "",
    "job create/delete: file holding the coordinator's operator token (its "
    "--admin_token_file), sent as \"authorization: Bearer <token>\".");
ABSL_FLAG(std::string, ca_cert, "",
          "PEM CA certificate(s): set = talk TLS to the coordinator and data "
          "servers, "
          "verifying them against it.");
ABSL_FLAG(std::string, client_cert, "",
          "PEM client certificate for servers that demand one (mutual TLS); "
          "needs --ca_cert.");
ABSL_FLAG(std::string, client_key, "", "PEM private key for --client_cert.");

namespace sluice::cli {

int Fail(const absl::Status& status) {
  // Code and message (not ToString(): its payloads are raw bytes).
  std::fprintf(stderr, "sluicectl: %s: %s\n",
               absl::StatusCodeToString(status.code()).c_str(),
               std::string(status.message()).c_str());
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status))
    return kUnreachable;
  return kError;
}

int Usage(const std::string& message) {
  std::fprintf(stderr, "sluicectl: %s (see sluicectl --help)\n",
               message.c_str());
  return kUsage;
}

namespace {
std::shared_ptr<grpc::ChannelCredentials>& CredentialsSlot() {
  static auto* creds = new std::shared_ptr<grpc::ChannelCredentials>();
  return *creds;
}

std::optional<ClientTls>& ClientTlsSlot() {
  static auto* tls = new std::optional<ClientTls>();
  return *tls;
}

}  // namespace

// The operator token of --admin_token_file (empty: none).
std::string& AdminToken() {
  static std::string* token = new std::string();
  return *token;
}

absl::Status LoadCredentials() {
  ASSIGN_OR_RETURN(
      CredentialsSlot(),
      ClientCredentialsFromFiles(ClientTlsFiles{
          absl::GetFlag(FLAGS_ca_cert), absl::GetFlag(FLAGS_client_cert),
          absl::GetFlag(FLAGS_client_key), "--ca_cert", "--client_cert",
          "--client_key"}));
  if (!absl::GetFlag(FLAGS_ca_cert).empty()) {
    ASSIGN_OR_RETURN(ClientTlsSlot(),
                     ReadClientTls(absl::GetFlag(FLAGS_ca_cert),
                                   absl::GetFlag(FLAGS_client_cert),
                                   absl::GetFlag(FLAGS_client_key)));
  }
  ASSIGN_OR_RETURN(AdminToken(),
                   ReadSecretFile(absl::GetFlag(FLAGS_admin_token_file),
                                  "admin_token_file"));
  return absl::OkStatus();
}

std::shared_ptr<grpc::ChannelCredentials> Credentials() {
  return CredentialsSlot() != nullptr ? CredentialsSlot()
                                      : grpc::InsecureChannelCredentials();
}

std::optional<ClientTls> ClientTlsOrNone() { return ClientTlsSlot(); }

std::unique_ptr<v1::Coordinator::Stub> CoordinatorStub(
    const std::string& address) {
  return v1::Coordinator::NewStub(CoordinatorChannel(address, Credentials()));
}

std::unique_ptr<grpc::ClientContext> Deadline(bool wait_for_ready) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(
      absl::ToChronoTime(absl::Now() + absl::GetFlag(FLAGS_timeout)));
  // A coordinator that is still starting (`sluicectl up &` on the line
  // before) refuses connections for a moment: wait for it, up to --timeout,
  // instead of failing at the first refusal.
  ctx->set_wait_for_ready(wait_for_ready);
  // The operator token, for a coordinator started with --admin_token_file.
  if (!AdminToken().empty()) {
    ctx->AddMetadata("authorization", "Bearer " + AdminToken());
  }
  return ctx;
}

absl::Status Rpc(const grpc::Status& s, const std::string& what) {
  absl::Status status = FromGrpcStatus(s);
  if (status.ok()) return status;
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) {
    absl::Status mismatch =
        CheckTransport("coordinator", absl::GetFlag(FLAGS_coordinator),
                       !absl::GetFlag(FLAGS_ca_cert).empty(), "--ca_cert");
    if (!mismatch.ok()) {
      return absl::Status(mismatch.code(),
                          absl::StrCat(what, ": ", mismatch.message()));
    }
    if (absl::IsDeadlineExceeded(status)) {
      return absl::Status(
          status.code(),
          absl::StrCat(what, ": coordinator ", absl::GetFlag(FLAGS_coordinator),
                       " unreachable or not answering for ",
                       absl::FormatDuration(absl::GetFlag(FLAGS_timeout)),
                       " (--timeout)"));
    }
    return absl::Status(
        status.code(),
        absl::StrCat(what, ": coordinator ", absl::GetFlag(FLAGS_coordinator),
                     " unreachable: ", status.message()));
  }
  return absl::Status(status.code(),
                      absl::StrCat(what, ": ", status.message()));
}

std::string ToJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, options);
  return out;
}

}  // namespace sluice::cli
