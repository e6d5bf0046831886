// The name of a data-server pool (JobSpec.pool, RegisterDataServer.pool,
// sluice-dataserver --pool): 0-64 characters of [A-Za-z0-9._-]; "" is the
// default pool.
#ifndef SLUICE_SERVER_COMMON_POOL_NAME_H_
#define SLUICE_SERVER_COMMON_POOL_NAME_H_

#include <algorithm>

#include "absl/strings/string_view.h"

namespace sluice {

inline bool ValidPoolName(absl::string_view pool) {
  return pool.size() <= 64 && std::all_of(pool.begin(), pool.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                  (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
         });
}

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_POOL_NAME_H_
