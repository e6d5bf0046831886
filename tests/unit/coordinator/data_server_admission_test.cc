#include "server/coordinator/data_server_admission.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "server/common/lease_token.h"
#include "tests/testing/status_matchers.h"

namespace sluice {
namespace {

using ::sluice::testing::StatusIs;
using ::testing::HasSubstr;

// With a lease secret, only a data server holding it can register (anyone
// else could register an address and have leases routed there); capacity
// and address are bounded either way.
TEST(DataServerAdmissionTest, RegistrationNeedsTheLeaseSecretsCredential) {
  const auto check = [](const v1::RegisterDataServer& r) {
    return CheckDataServerRegistration(r, "s3cret");
  };
  v1::RegisterDataServer r;
  r.set_address("10.0.0.7:7071");
  r.set_capacity(1);
  EXPECT_THAT(check(r), StatusIs(absl::StatusCode::kUnauthenticated,
                                 HasSubstr("carries no credential")));
  r.set_credential(SignRegistration(r.address(), "other"));
  EXPECT_THAT(check(r), StatusIs(absl::StatusCode::kUnauthenticated,
                                 HasSubstr("does not match")));
  r.set_credential(
      SignRegistration("10.0.0.8:7071", "s3cret"));  // another address's
  EXPECT_THAT(check(r), StatusIs(absl::StatusCode::kUnauthenticated));
  r.set_credential(SignRegistration(r.address(), "s3cret"));
  EXPECT_OK(check(r));
  r.set_capacity(2147483647);
  EXPECT_THAT(check(r), StatusIs(absl::StatusCode::kInvalidArgument,
                                 HasSubstr("register.capacity")));
  r.set_capacity(1);
  r.set_address(std::string(1 << 20, 'a') + ":1");
  r.set_credential(SignRegistration(r.address(), "s3cret"));
  auto long_address = check(r);
  EXPECT_THAT(long_address, StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr("register.address")));
  EXPECT_LT(long_address.message().size(), 300u);
}

// Without a lease secret anyone may register, but the fields are bounded
// all the same, each refusal naming its field.
TEST(DataServerAdmissionTest, FieldsAreBoundedWithoutASecret) {
  v1::RegisterDataServer r;
  r.set_address("10.0.0.7:7071");
  EXPECT_TRUE(CheckDataServerRegistration(r, "").ok());
  r.set_address("no-port");
  EXPECT_THAT(CheckDataServerRegistration(r, ""),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("register.address")));
  r.set_address("10.0.0.7:7071");
  r.set_node(std::string(257, 'n'));
  EXPECT_THAT(
      CheckDataServerRegistration(r, ""),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("register.node")));
  r.clear_node();
  r.set_pool("a pool");
  EXPECT_THAT(
      CheckDataServerRegistration(r, ""),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("register.pool")));
  r.set_pool("gpu-a");
  r.set_capacity(-1);
  EXPECT_THAT(CheckDataServerRegistration(r, ""),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("register.capacity")));
  r.set_capacity(1024);
  EXPECT_TRUE(CheckDataServerRegistration(r, "").ok());
  EXPECT_TRUE(
      CheckFenceSeen("heartbeat.max_fence_seen", uint64_t{1} << 62).ok());
  EXPECT_THAT(
      CheckFenceSeen("heartbeat.max_fence_seen", (uint64_t{1} << 62) + 1),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("heartbeat.max_fence_seen")));
}

}  // namespace
}  // namespace sluice
