// libFuzzer target over the coordinator's request handling (the logic layer
// the gRPC adapter calls): job specs, trainer sessions and their messages,
// data-server registrations, time passing and lease expiry, in any order.
// Input: a sequence of records [op byte][u16 length][length bytes]:
//   op % 8: 0 CreateJob(JobSpec), 1 open a session, 2 a TrainerMessage on
//   session (op / 8) % 4, 3 close that session, 4 advance the fake clock by
//   length ms and expire leases, 5 DeleteJob(name), 6 GetJob/ListJobs and
//   an Audit (the body as an AuditRequest, of the first job if it names
//   none), 7 check a data-server registration.
// Specs larger than a small plan are skipped (the limits themselves are
// unit-tested; this looks for crashes and sanitizer reports).
// Build and run: make fuzz (clang, -fsanitize=fuzzer,address,undefined).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "server/coordinator/coordinator_service.h"
#include "tests/testing/fake_clock.h"

namespace {

class NullSink : public sluice::SessionSink {
 public:
  void Send(sluice::v1::CoordinatorMessage) override {}
  void Finish(const absl::Status&) override {}
};

bool SmallEnough(const sluice::v1::JobSpec& spec) {
  if (spec.manifest().shards_size() > 64 || spec.world_size() > 64)
    return false;
  int64_t total = 0;
  for (const auto& s : spec.manifest().shards()) {
    if (s.num_samples() < 0 || s.num_samples() > 10000) return false;
    total += s.num_samples();
  }
  // A job with sources: the same bounds over all of them and the epoch.
  if (spec.sources_size() > 8 || spec.samples_per_epoch() < 0 ||
      spec.samples_per_epoch() > 20000)
    return false;
  for (const auto& src : spec.sources()) {
    if (src.manifest().shards_size() > 16 || src.samples_per_epoch() < 0 ||
        src.samples_per_epoch() > 20000)
      return false;
    for (const auto& s : src.manifest().shards()) {
      if (s.num_samples() < 0 || s.num_samples() > 10000) return false;
      total += s.num_samples();
    }
  }
  return total <= 20000;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sluice::testing::FakeClock clock;
  sluice::CoordinatorOptions options;
  options.clock = &clock;
  options.wait_for_data_servers = false;
  options.lease_secret = "fuzz";
  auto service = sluice::CoordinatorService::Create(options);
  if (!service.ok()) return 0;
  std::map<int, int64_t> sessions;  // slot -> session id
  size_t at = 0;
  while (at + 3 <= size) {
    const uint8_t op = data[at];
    const size_t length =
        std::min<size_t>(data[at + 1] | (data[at + 2] << 8), size - at - 3);
    const char* body = reinterpret_cast<const char*>(data + at + 3);
    at += 3 + length;
    const int slot = (op / 8) % 4;
    switch (op % 8) {
      case 0: {
        sluice::v1::JobSpec spec;
        if (spec.ParseFromArray(body, static_cast<int>(length)) &&
            SmallEnough(spec)) {
          (void)(*service)->CreateJob(spec);
        }
        break;
      }
      case 1:
        if (sessions.count(slot) == 0) {
          sessions[slot] =
              (*service)->OpenSession(std::make_shared<NullSink>());
        }
        break;
      case 2: {
        auto it = sessions.find(slot);
        sluice::v1::TrainerMessage m;
        if (it != sessions.end() &&
            m.ParseFromArray(body, static_cast<int>(length))) {
          if (m.has_hello() && m.hello().num_workers() > 8)
            break;  // keep plans small
          (*service)->OnMessage(it->second, m);
        }
        break;
      }
      case 3: {
        auto it = sessions.find(slot);
        if (it != sessions.end()) {
          (*service)->CloseSession(it->second);
          sessions.erase(it);
        }
        break;
      }
      case 4:
        clock.Advance(absl::Milliseconds(static_cast<int64_t>(length) * 97));
        (*service)->ExpireLeases();
        break;
      case 5:
        (void)(*service)->DeleteJob(std::string(body, length));
        break;
      case 6: {
        (void)(*service)->GetJob(std::string(body, length), true);
        absl::StatusOr<std::vector<sluice::v1::Job>> jobs =
            (*service)->ListJobs();
        // The body as an audit of the first job when it names none.
        sluice::v1::AuditRequest audit;
        if (audit.ParseFromArray(body, static_cast<int>(length))) {
          if (audit.job().empty() && jobs.ok() && !jobs->empty())
            audit.set_job(jobs->front().spec().name());
          (void)(*service)->Audit(audit);
        }
        break;
      }
      default: {
        sluice::v1::RegisterDataServer r;
        if (r.ParseFromArray(body, static_cast<int>(length))) {
          (void)(*service)->CheckRegistration(r);
        }
        break;
      }
    }
  }
  for (const auto& [slot, id] : sessions) (*service)->CloseSession(id);
  return 0;
}
