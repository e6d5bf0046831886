#include "server/coordinator/open_journal.h"

#include <utility>

#include "server/common/status_macros.h"
#include "server/coordinator/file_journal.h"

namespace sluice {

absl::StatusOr<RecoveredJournal> OpenFileJournal(
    const std::string& dir, CoordinatorMetrics* metrics,
    std::function<void(const absl::Status&)> on_failure) {
  FsyncObserver observer;
  if (metrics != nullptr) {
    observer = [metrics](double s) { metrics->fsync_latency.Observe(s); };
  }
  RecoveredJournal recovered;
  CoordinatorState* state = &recovered.state;
  ASSIGN_OR_RETURN(
      std::unique_ptr<FileJournal> journal,
      FileJournal::Open(
          dir, /*create=*/true,
          [state](const JournalRecord& r) { return state->Apply(r); },
          std::move(observer)));
  journal->set_on_failure(std::move(on_failure));
  recovered.replayed_records = journal->replayed_records();
  recovered.journal = std::move(journal);
  return recovered;
}

absl::StatusOr<RecoveredJournal> OpenEtcdJournal(EtcdJournalOptions options,
                                                 CoordinatorMetrics* metrics) {
  if (metrics != nullptr && !options.on_commit) {
    options.on_commit = [metrics](double s) {
      metrics->fsync_latency.Observe(s);
      metrics->etcd_request_latency.Observe(s);
    };
  }
  // Heap-held: the state moves into the result after replay, while the
  // callbacks hold its address.
  auto state = std::make_unique<CoordinatorState>();
  CoordinatorState* replayed = state.get();
  ASSIGN_OR_RETURN(
      std::unique_ptr<EtcdJournal> journal,
      EtcdJournal::Open(
          std::move(options),
          [replayed](const JournalRecord& r) { return replayed->Apply(r); },
          // The leader compacted while this one waited as a standby.
          [replayed] { *replayed = CoordinatorState(); }));
  RecoveredJournal recovered;
  recovered.state = std::move(*state);
  recovered.replayed_records = journal->replayed_records();
  recovered.journal = std::move(journal);
  return recovered;
}

}  // namespace sluice
