#include "client/cpp/fetch_turn.h"

namespace sluice::client_internal {

bool FetchMayStart(const FetchTurnView& unit,
                   const std::vector<FetchTurnView>& held) {
  for (const FetchTurnView& other : held) {
    if (other.order >= unit.order || !other.streaming ||
        other.data_server != unit.data_server) {
      continue;
    }
    if (other.last_batch_samples == 0 ||
        other.remaining > other.last_batch_samples) {
      return false;
    }
  }
  return true;
}

}  // namespace sluice::client_internal
