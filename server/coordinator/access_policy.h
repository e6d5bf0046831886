// AccessPolicy: who may administer the coordinator (CreateJob, DeleteJob,
// ResetOnce), who may copy a job for another world size, and who may register
// as a data server, decided from what the call carries (a Peer) alone. The gRPC
// adapter only extracts the Peer from its call context; no transport type
// appears here.
#ifndef SLUICE_SERVER_COORDINATOR_ACCESS_POLICY_H_
#define SLUICE_SERVER_COORDINATOR_ACCESS_POLICY_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "sluice/v1/coordinator.pb.h"

namespace sluice {

// What a call presents: the names of its client certificate (common name
// and subject alternative names; empty without mutual TLS) and its
// "authorization" metadata, if it sent one.
struct Peer {
  std::vector<std::string> identities;
  std::optional<std::string> authorization;
};

// Trainers' RPCs are not checked here.
struct AccessPolicy {
  // False: anyone who reaches the port administers (the plaintext demo).
  bool enforce = false;
  // Non-empty: a call with the metadata "authorization: Bearer <token>" is
  // an operator's.
  std::string token;
  // A call over mutual TLS whose client certificate's common name or a
  // subject alternative name is in this list is an operator's.
  std::vector<std::string> identities;
  // Non-empty: RegisterDataServer only over mutual TLS with a client
  // certificate named here (PERMISSION_DENIED otherwise), in addition to
  // the lease secret's credential when a secret is set.
  std::vector<std::string> data_server_identities;

  // OK for an operator's call to `what` (the RPC's name, quoted in the
  // error). With `enforce`: UNAUTHENTICATED for a call without any
  // credential, PERMISSION_DENIED for one whose credential is not an
  // operator's, and PERMISSION_DENIED for everyone when neither a token nor
  // identities are configured. The token is compared in constant time.
  absl::Status AuthorizeAdmin(const Peer& peer, absl::string_view what) const;
  // OK for a CreateJob of `request`: an operator's call (AuthorizeAdmin), or
  // anyone's copy of a job for another world size under its canonical name
  // (copy_of set and spec.name == CopyJobName(copy_of, spec.world_size)),
  // which reads nothing the job does not: what a trainer whose world size
  // changed creates.
  absl::Status AuthorizeCreateJob(const Peer& peer,
                                  const v1::CreateJobRequest& request) const;
  // OK for a RegisterDataServer call from `peer`: always, unless
  // data_server_identities is set and names none of the peer's identities
  // (PERMISSION_DENIED, quoting the certificate's first name).
  absl::Status AuthorizeDataServer(const Peer& peer) const;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_ACCESS_POLICY_H_
