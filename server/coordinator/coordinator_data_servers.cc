// CoordinatorService: the data servers' registration, heartbeats and
// liveness (the registry itself is data_server_registry.h).
#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/common/lease_token.h"
#include "server/common/logging.h"
#include "server/common/pool_name.h"
#include "server/common/quote.h"
#include "server/common/status_macros.h"
#include "server/coordinator/coordinator_service.h"
#include "server/coordinator/coordinator_service_internal.h"

namespace sluice {

using coordinator_internal::Invalid;
using coordinator_internal::kMaxDataServerCapacity;
using coordinator_internal::kMaxFenceSeen;
using coordinator_internal::kMaxIdBytes;

absl::Status CoordinatorService::CheckRegistration(
    const v1::RegisterDataServer& r) const {
  // Who is asking first: an unauthenticated caller learns nothing more.
  if (!options_.lease_secret.empty()) {
    RETURN_IF_ERROR(
        VerifyRegistration(r.address(), r.credential(), options_.lease_secret));
  }
  if (r.address().empty() || r.address().size() > kMaxIdBytes ||
      r.address().find(':') == std::string::npos) {
    return Invalid(
        "register.address",
        absl::StrCat(QuotePrefix(r.address()), " is not host:port (at most ",
                     kMaxIdBytes, " bytes)"));
  }
  if (r.node().size() > kMaxIdBytes) {
    return Invalid("register.node",
                   absl::StrCat(QuotePrefix(r.node()), " is longer than ",
                                kMaxIdBytes, " bytes"));
  }
  if (!ValidPoolName(r.pool())) {
    return Invalid("register.pool", absl::StrCat(QuotePrefix(r.pool()),
                                                 " must be 0-64 characters of "
                                                 "[A-Za-z0-9._-]"));
  }
  if (r.capacity() < 0 || r.capacity() > kMaxDataServerCapacity) {
    return Invalid("register.capacity",
                   absl::StrCat(r.capacity(), " is outside [0, ",
                                kMaxDataServerCapacity, "]"));
  }
  return CheckFenceSeen("register.max_fence_seen", r.max_fence_seen());
}

absl::Status CoordinatorService::CheckFenceSeen(absl::string_view field,
                                                uint64_t max_fence_seen) {
  if (max_fence_seen > kMaxFenceSeen) {
    return Invalid(field, absl::StrCat(max_fence_seen,
                                       " is beyond the fence space (at most ",
                                       kMaxFenceSeen, ")"));
  }
  return absl::OkStatus();
}

int64_t CoordinatorService::RegisterDataServer(
    const std::string& address, int32_t capacity,
    std::shared_ptr<DataServerSink> sink, uint64_t max_fence_seen,
    const std::string& node, const std::string& pool) {
  Effects fx;
  int64_t id;
  {
    ServiceLock lock(this);
    RaiseSeenFenceFloor(max_fence_seen);
    const bool none_live = !data_servers_.AnyLiveIn(pool);
    if (sink != nullptr) {
      // Under mu_, so the reply precedes any hint for this server.
      v1::CoordinatorToDataServer reply;
      reply.mutable_registered()->set_heartbeat_interval_ms(
          absl::ToInt64Milliseconds(data_server_timeout() / 3));
      reply.mutable_registered()->set_heartbeat_timeout_ms(
          absl::ToInt64Milliseconds(data_server_timeout()));
      reply.mutable_registered()->set_acks_heartbeats(true);
      sink->Send(reply);
    }
    id = data_servers_.Add(address, capacity, std::move(sink), node, pool);
    UpdateDataServerMetric();
    if (none_live) PumpAllLocked(fx);  // units waiting for a data server
    SubmitLocked(fx);
  }
  DeliverReady();
  return id;
}

void CoordinatorService::RaiseSeenFenceFloor(uint64_t max_fence_seen) {
  const uint64_t floor = std::min(max_fence_seen, kMaxFenceSeen) + 1;
  uint64_t now = seen_fence_floor_.load();
  while (now < floor && !seen_fence_floor_.compare_exchange_weak(now, floor)) {
  }
}

void CoordinatorService::DataServerHeartbeat(
    int64_t id, uint64_t max_fence_seen, const DataServerRegistry::Load* load) {
  RaiseSeenFenceFloor(max_fence_seen);
  bool none_was_live = false;
  if (!data_servers_.Heartbeat(id, &none_was_live, load)) return;
  UpdateDataServerMetric();
  if (!none_was_live) return;
  // The first live server again: the units waiting for one go out.
  Effects fx;
  {
    ServiceLock lock(this);
    PumpAllLocked(fx);
    SubmitLocked(fx);
  }
  DeliverReady();
}

void CoordinatorService::UnregisterDataServer(int64_t id) {
  ServiceLock lock(this);
  data_servers_.Remove(id);
  UpdateDataServerMetric();
}

void CoordinatorService::DataServerDraining(int64_t id) {
  const std::optional<std::string> address = data_servers_.SetDraining(id);
  if (!address.has_value()) return;
  UpdateDataServerMetric();
  LogInfo("data server %s is draining: routing it nothing new", *address);
  // Its leases' holders give back the ones they have not started reading.
  Effects fx;
  {
    ServiceLock lock(this);
    v1::CoordinatorMessage leaving;
    leaving.mutable_leaving()->set_data_server(*address);
    for (const std::string& holder : leases_.HoldersOn(*address)) {
      if (Session* session = sessions_.SessionOf(holder); session != nullptr) {
        fx.sends.emplace_back(session->sink, leaving);
      }
    }
    SubmitLocked(fx);
  }
  DeliverReady();
}

std::vector<std::string> CoordinatorService::LiveDataServers() {
  ServiceLock lock(this);
  return data_servers_.LiveAddresses();
}

void CoordinatorService::UpdateDataServerMetric() {
  if (options_.metrics == nullptr) return;
  options_.metrics->data_servers.Set(data_servers_.LiveCount());
  options_.metrics->draining_data_servers.Set(data_servers_.DrainingCount());
}

}  // namespace sluice
