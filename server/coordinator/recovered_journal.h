// RecoveredJournal: a coordinator journal, opened, and the state its
// records replayed to: what CoordinatorService::Create is given
// (open_journal.h opens one from a directory or from etcd).
#ifndef SLUICE_SERVER_COORDINATOR_RECOVERED_JOURNAL_H_
#define SLUICE_SERVER_COORDINATOR_RECOVERED_JOURNAL_H_

#include <cstdint>
#include <memory>

#include "server/coordinator/coordinator_state.h"
#include "server/coordinator/journal.h"

namespace sluice {

struct RecoveredJournal {
  std::unique_ptr<Journal> journal;  // null = a service kept in memory
  CoordinatorState state;
  int64_t replayed_records = 0;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_RECOVERED_JOURNAL_H_
