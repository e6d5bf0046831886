// Tells whether a gRPC endpoint speaks TLS or plaintext, by connecting to it.
//
// gRPC reports a client and server that disagree about TLS as a bare
// connection failure ("Socket closed" for a plaintext client at a TLS
// server), which a client would otherwise retry until its timeout. After a
// failed connection, CheckTransport asks the endpoint itself: it starts a TLS
// handshake (OpenSSL, no verification; a server that answers with its
// certificate speaks TLS) and sends the HTTP/2 client preface (a server that
// answers with a SETTINGS frame speaks plaintext HTTP/2). Neither answer
// (refused, nothing listening, a timeout) says nothing: the caller's own
// error stands.
#ifndef SLUICE_SERVER_COMMON_TLS_PROBE_H_
#define SLUICE_SERVER_COMMON_TLS_PROBE_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace sluice {

enum class Transport { kUnknown, kPlaintext, kTls };

// What the endpoint at `address` speaks. `address` is a gRPC target as
// clients accept it: "HOST:PORT", "[V6]:PORT", "ipv4:A:P,B:P", "dns:///H:P"
// or several "HOST:PORT" separated by commas (the first that answers
// decides). Blocks for up to about 2 x `timeout` per address tried.
Transport ProbeTransport(absl::string_view address, absl::Duration timeout);

// FAILED_PRECONDITION naming `what` (e.g. "coordinator") and `address` when
// the endpoint speaks TLS and `client_tls` is false, or the reverse; OK when
// they agree or the probe learns nothing. `tls_hint` says how this client is
// given a CA (e.g. "--ca_cert"), for the message.
absl::Status CheckTransport(absl::string_view what, absl::string_view address,
                            bool client_tls, absl::string_view tls_hint,
                            absl::Duration timeout = absl::Seconds(1));

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_TLS_PROBE_H_
