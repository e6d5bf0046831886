#include "server/coordinator/access_policy.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace sluice {
namespace {

using ::sluice::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

Peer WithToken(const std::string& authorization) {
  Peer peer;
  peer.authorization = authorization;
  return peer;
}

Peer WithCertificate(std::vector<std::string> names) {
  Peer peer;
  peer.identities = std::move(names);
  return peer;
}

AccessPolicy Enforced(std::string token, std::vector<std::string> identities) {
  AccessPolicy policy;
  policy.enforce = true;
  policy.token = std::move(token);
  policy.identities = std::move(identities);
  return policy;
}

TEST(AccessPolicyTest, WithoutEnforcementAnyoneAdministers) {
  EXPECT_OK(AccessPolicy{}.AuthorizeAdmin(Peer{}, "CreateJob"));
  EXPECT_OK(AccessPolicy{}.AuthorizeAdmin(WithToken("Bearer x"), "DeleteJob"));
}

TEST(AccessPolicyTest, TheOperatorTokenAdministers) {
  const AccessPolicy policy = Enforced("s3cret", {});
  EXPECT_OK(policy.AuthorizeAdmin(WithToken("Bearer s3cret"), "CreateJob"));
  EXPECT_THAT(
      policy.AuthorizeAdmin(WithToken("Bearer s3cre"), "CreateJob"),
      StatusIs(absl::StatusCode::kPermissionDenied,
               AllOf(HasSubstr("CreateJob: the authorization metadata is not "
                               "the operator token"),
                     Not(HasSubstr("s3cre")))));
  EXPECT_THAT(policy.AuthorizeAdmin(WithToken("s3cret"), "CreateJob"),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(policy.AuthorizeAdmin(WithToken("Bearer s3cret "), "CreateJob"),
              StatusIs(absl::StatusCode::kPermissionDenied));
}

TEST(AccessPolicyTest, AnOperatorCertificateAdministers) {
  const AccessPolicy policy = Enforced("", {"ops", "admin.example"});
  EXPECT_OK(policy.AuthorizeAdmin(WithCertificate({"node-7", "admin.example"}),
                                  "DeleteJob"));
  EXPECT_THAT(
      policy.AuthorizeAdmin(WithCertificate({"trainer-3"}), "DeleteJob"),
      StatusIs(absl::StatusCode::kPermissionDenied,
               HasSubstr("DeleteJob: client certificate \"trainer-3\" is not "
                         "an operator identity (--admin_identities)")));
}

TEST(AccessPolicyTest, NoCredentialIsUnauthenticatedNamingWhatWouldDo) {
  EXPECT_THAT(
      Enforced("t", {"ops"}).AuthorizeAdmin(Peer{}, "ResetOnce"),
      StatusIs(absl::StatusCode::kUnauthenticated,
               AllOf(HasSubstr("ResetOnce needs an operator credential"),
                     HasSubstr("authorization: Bearer <token>"),
                     HasSubstr(" or a client certificate named in "
                               "--admin_identities"))));
  EXPECT_THAT(Enforced("t", {}).AuthorizeAdmin(Peer{}, "ResetOnce"),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       Not(HasSubstr("--admin_identities"))));
  // A certificate that is not an operator's, and no token sent.
  EXPECT_THAT(
      Enforced("t", {"ops"}).AuthorizeAdmin(WithCertificate({"x"}), "Create"),
      StatusIs(absl::StatusCode::kPermissionDenied,
               HasSubstr("and no operator token was sent")));
}

TEST(AccessPolicyTest, NothingToAcceptRefusesEveryone) {
  const AccessPolicy policy = Enforced("", {});
  EXPECT_THAT(policy.AuthorizeAdmin(WithToken("Bearer "), "CreateJob"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("accepts no operator credential")));
  EXPECT_THAT(policy.AuthorizeAdmin(WithCertificate({""}), "CreateJob"),
              StatusIs(absl::StatusCode::kPermissionDenied));
}

v1::CreateJobRequest Copy(const std::string& of, const std::string& name,
                          int32_t world_size) {
  v1::CreateJobRequest request;
  request.set_copy_of(of);
  request.mutable_spec()->set_name(name);
  request.mutable_spec()->set_world_size(world_size);
  return request;
}

// A job's copy for another world size under its canonical name reads
// nothing new: any caller (a trainer whose world size changed) makes it.
// Every other CreateJob needs the operator's credential.
TEST(AccessPolicyTest, AnyoneCopiesAJobForAnotherWorldSizeUnderItsName) {
  const AccessPolicy policy = Enforced("s3cret", {});
  EXPECT_OK(
      policy.AuthorizeCreateJob(Peer{}, Copy("imagenet", "imagenet.w3", 3)));
  EXPECT_THAT(
      policy.AuthorizeCreateJob(Peer{}, Copy("imagenet", "imagenet.w2", 3)),
      StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("CreateJob")));
  EXPECT_THAT(policy.AuthorizeCreateJob(Peer{}, Copy("imagenet", "mine", 3)),
              StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_OK(policy.AuthorizeCreateJob(WithToken("Bearer s3cret"),
                                      Copy("imagenet", "mine", 3)));
  v1::CreateJobRequest fresh;
  fresh.mutable_spec()->set_name("imagenet.w3");
  EXPECT_THAT(policy.AuthorizeCreateJob(Peer{}, fresh),
              StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_OK(policy.AuthorizeCreateJob(WithToken("Bearer s3cret"), fresh));
}

TEST(AccessPolicyTest, DataServersNeedAListedCertificateOnlyWhenListed) {
  AccessPolicy policy;
  EXPECT_OK(policy.AuthorizeDataServer(Peer{}));
  policy.data_server_identities = {"ds-a", "ds-b"};
  EXPECT_OK(policy.AuthorizeDataServer(WithCertificate({"host", "ds-b"})));
  EXPECT_THAT(
      policy.AuthorizeDataServer(Peer{}),
      StatusIs(absl::StatusCode::kPermissionDenied,
               HasSubstr("RegisterDataServer: the call carries no "
                         "client certificate (--data_server_identities)")));
  EXPECT_THAT(policy.AuthorizeDataServer(WithCertificate({"trainer"})),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("client certificate \"trainer\" is not a data "
                                 "server identity")));
  // An operator's certificate is not a data server's.
  policy.identities = {"ops"};
  EXPECT_THAT(policy.AuthorizeDataServer(WithCertificate({"ops"})),
              StatusIs(absl::StatusCode::kPermissionDenied));
}

}  // namespace
}  // namespace sluice
