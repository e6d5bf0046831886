// Opening the coordinator's journal: the composition root (main.cc, tests
// of restarts) opens a file or etcd journal here, replaying it into a
// CoordinatorState, and hands both to CoordinatorService::Create.
#ifndef SLUICE_SERVER_COORDINATOR_OPEN_JOURNAL_H_
#define SLUICE_SERVER_COORDINATOR_OPEN_JOURNAL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/coordinator/coordinator_metrics.h"
#include "server/coordinator/etcd_journal.h"
#include "server/coordinator/recovered_journal.h"

namespace sluice {

// `<dir>/journal.log` (created with `dir` if missing), its fsyncs timed in
// `metrics` (optional). `on_failure` is called once when a write or fsync
// fails (FileJournal::set_on_failure). The errors of FileJournal::Open,
// and DATA_LOSS for a record the state refuses.
absl::StatusOr<RecoveredJournal> OpenFileJournal(
    const std::string& dir, CoordinatorMetrics* metrics = nullptr,
    std::function<void(const absl::Status&)> on_failure = nullptr);

// The journal in etcd: blocks while another coordinator leads, replaying
// what it writes, and returns once this one leads (EtcdJournal::Open). Its
// transactions are timed in `metrics` (optional) unless `options.on_commit`
// is set.
absl::StatusOr<RecoveredJournal> OpenEtcdJournal(
    EtcdJournalOptions options, CoordinatorMetrics* metrics = nullptr);

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_OPEN_JOURNAL_H_
