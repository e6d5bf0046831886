// Scripted trainers and helpers for tests of CoordinatorService: a sink
// that records what a session is sent, builders of trainer messages and
// job specs, a service on a fake clock (CoordinatorServiceTest) and
// SimTrainer, which consumes its grants sample by sample as a Reader does.
#ifndef SLUICE_TESTS_TESTING_COORDINATOR_FIXTURE_H_
#define SLUICE_TESTS_TESTING_COORDINATOR_FIXTURE_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "server/common/work_unit.h"
#include "server/coordinator/coordinator_service.h"
#include "server/coordinator/open_journal.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/status_matchers.h"

namespace sluice::testing {

// Records what the service sends to one session.
class RecordingSink : public SessionSink {
 public:
  void Send(v1::CoordinatorMessage m) override {
    inbox.push_back(std::move(m));
  }
  void Finish(const absl::Status& s) override { finished = s; }
  // Pops every Grant received so far.
  std::vector<v1::Lease> TakeGrants() {
    std::vector<v1::Lease> grants;
    std::vector<v1::CoordinatorMessage> rest;
    for (auto& m : inbox) {
      if (m.has_grant())
        grants.push_back(m.grant().lease());
      else
        rest.push_back(m);
    }
    inbox = rest;
    return grants;
  }
  int Count(v1::CoordinatorMessage::MsgCase c) const {
    int n = 0;
    for (const auto& m : inbox) n += m.msg_case() == c;
    return n;
  }
  std::vector<v1::CoordinatorMessage> inbox;
  std::optional<absl::Status> finished;
};

inline v1::JobSpec Spec(const std::string& name, std::vector<int64_t> sizes,
                        int32_t world_size, int64_t epochs) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.mutable_manifest();
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto* s = spec.mutable_manifest()->add_shards();
    s->set_url("/data/shard-" + std::to_string(i) + ".tar");
    s->set_num_samples(sizes[i]);
  }
  spec.set_world_size(world_size);
  spec.set_num_epochs(epochs);
  spec.set_shuffle(true);
  spec.set_shuffle_window(1);  // units of one shard; windows tested apart
  spec.set_seed(5);
  spec.set_lease_ttl_ms(2000);
  return spec;
}

inline v1::TrainerMessage Hello(const std::string& job, int rank,
                                const std::string& trainer) {
  v1::TrainerMessage m;
  m.mutable_hello()->set_job(job);
  m.mutable_hello()->set_rank(rank);
  m.mutable_hello()->set_trainer_id(trainer);
  return m;
}

inline v1::TrainerMessage Want(int n) {
  v1::TrainerMessage m;
  m.mutable_want()->set_credits(n);
  return m;
}

// Opens trainer "t"'s session of rank 0 of job "j" (its messages arrive in
// `sink`), asks for one lease and returns the session's id.
inline int64_t OpenAndWantOne(CoordinatorService& service,
                              const std::shared_ptr<RecordingSink>& sink) {
  const int64_t id = service.OpenSession(sink);
  service.OnMessage(id, Hello("j", 0, "t"));
  service.OnMessage(id, Want(1));
  return id;
}

inline v1::TrainerMessage Complete(const v1::Lease& l) {
  v1::TrainerMessage m;
  m.mutable_complete()->mutable_lease()->set_lease_id(l.lease_id());
  m.mutable_complete()->mutable_lease()->set_fence(l.fence());
  return m;
}

inline v1::TrainerMessage Progress(const v1::Lease& l, int64_t consumed) {
  v1::TrainerMessage m;
  m.mutable_progress()->mutable_lease()->set_lease_id(l.lease_id());
  m.mutable_progress()->mutable_lease()->set_fence(l.fence());
  m.mutable_progress()->set_consumed(consumed);
  return m;
}

// Options of a service on a fake clock whose trainers are scripted (they
// read nothing), for tests that restart it over a journal (CreateJournaled).
inline CoordinatorOptions JournaledOptions(FakeClock* clock) {
  CoordinatorOptions options;
  options.clock = clock;
  options.wait_for_data_servers = false;  // scripted trainers read nothing
  return options;
}

// A service over the file journal in `dir`, replayed (as after a restart).
inline absl::StatusOr<std::unique_ptr<CoordinatorService>> CreateJournaled(
    const CoordinatorOptions& options, const std::string& dir) {
  absl::StatusOr<RecoveredJournal> journal = OpenFileJournal(dir);
  if (!journal.ok()) return journal.status();
  return CoordinatorService::Create(options, *std::move(journal));
}

class CoordinatorServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions options;
    options.clock = &clock_;
    options.wait_for_data_servers = false;  // scripted trainers read nothing
    auto service = CoordinatorService::Create(options);
    ASSERT_OK(service);
    service_ = std::move(*service);
  }
  FakeClock clock_;
  std::unique_ptr<CoordinatorService> service_;
};

// A scripted trainer: takes grants in order and consumes them sample by
// sample, reporting each sample as it goes (acknowledgement order ==
// delivery order, as sluice::Reader does).
struct SimTrainer {
  SimTrainer(CoordinatorService& s, const std::string& job, int rank,
             const std::string& id, const v1::Cursor* cursor = nullptr,
             const std::string& attempt = "", int worker = 0,
             int num_workers = 0, const std::string& launch_id = "")
      : service(s), sink(std::make_shared<RecordingSink>()) {
    session = service.OpenSession(sink);
    v1::TrainerMessage hello = Hello(job, rank, id);
    hello.mutable_hello()->set_worker(worker);
    hello.mutable_hello()->set_num_workers(num_workers);
    hello.mutable_hello()->set_launch_id(launch_id);
    if (cursor != nullptr) {
      *hello.mutable_hello()->mutable_cursor() = *cursor;
      hello.mutable_hello()->set_resume_attempt(attempt);
    }
    Send(hello);
    Send(Want(2));
    Poll();
  }
  // Sends one message and waits until every reply was handed to the sink
  // (with a file journal, replies leave from the journal's flusher thread).
  void Send(const v1::TrainerMessage& m) {
    service.OnMessage(session, m);
    service.Flush();
  }
  // Takes in what the coordinator sent.
  void Poll() {
    for (v1::Lease& l : sink->TakeGrants()) held.push_back(l);
    for (const auto& m : sink->inbox) {
      if (m.has_revoke()) revoked.insert(m.revoke().lease_id());
      if (m.has_waiting()) waiting = m.waiting().kind();
      if (m.has_epoch_begin()) begins.push_back(m.epoch_begin());
      if (m.has_job_done()) job_done = true;
    }
    sink->inbox.clear();
  }
  // Consumes up to n samples; returns how many it could.
  int64_t Consume(int64_t n) {
    int64_t done = 0;
    while (done < n) {
      Poll();
      while (!held.empty() && revoked.count(held.front().lease_id()) > 0)
        held.pop_front();
      if (held.empty()) break;
      v1::Lease& l = held.front();
      const int64_t k = l.unit().begin() + delivered[l.lease_id()]++;
      consumed.push_back({l.epoch(), UnitIndex(l.unit()), k});
      ++done;
      if (k + 1 == l.unit().end()) {
        v1::Lease finished = l;
        held.pop_front();
        Send(Complete(finished));
      } else {
        Send(Progress(l, delivered[l.lease_id()]));
      }
    }
    return done;
  }
  CoordinatorService& service;
  std::shared_ptr<RecordingSink> sink;
  int64_t session = 0;
  std::deque<v1::Lease> held;
  std::map<std::string, int64_t> delivered;
  std::set<std::string> revoked;
  std::vector<v1::EpochBegin> begins;
  bool job_done = false;
  v1::WaitingKind waiting = v1::WAITING_KIND_UNSPECIFIED;
  std::vector<std::tuple<int64_t, int32_t, int64_t>>
      consumed;  // epoch, shard, index
};

inline v1::Cursor MakeCursor(const std::string& job, int64_t epoch,
                             int32_t world_size, std::vector<int64_t> counts) {
  v1::Cursor c;
  c.set_job(job);
  c.set_epoch(epoch);
  c.set_world_size(world_size);
  for (int64_t n : counts) c.add_consumed_per_rank(n);
  return c;
}

// Every sample each epoch served to `trainers`, with how often it was seen.
inline std::map<std::tuple<int64_t, int32_t, int64_t>, int> Tally(
    const std::vector<std::vector<std::tuple<int64_t, int32_t, int64_t>>>&
        parts) {
  std::map<std::tuple<int64_t, int32_t, int64_t>, int> seen;
  for (const auto& part : parts) {
    for (const auto& s : part) ++seen[s];
  }
  return seen;
}

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_TESTING_COORDINATOR_FIXTURE_H_
