#include "client/cpp/coordinator_session.h"

#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/cpp/completion_loop.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sluice/v1/coordinator.grpc.pb.h"
#include "tests/testing/fake_clock.h"

namespace sluice::client_internal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using v1::CoordinatorMessage;
using v1::TrainerMessage;

// A coordinator whose Session follows a script, on 127.0.0.1:0; it records
// the kind of every message each stream brought.
class ScriptedCoordinator final : public v1::Coordinator::Service {
 public:
  enum class Script {
    // Welcome, EpochBegin, EpochEnd after the Hello and Want; the stream
    // ends after one more message.
    kWelcomeThenOneMore,
    kWelcomeThenEnd,  // Welcome after the Hello, then OK
    kJobNotFound,     // NOT_FOUND at once
  };

  explicit ScriptedCoordinator(Script script) : script_(script) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~ScriptedCoordinator() override { server_->Shutdown(); }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  std::vector<std::vector<std::string>> streams() {
    absl::MutexLock lock(&mu_);
    return streams_;
  }
  // Waits until a stream brought `n` messages.
  void AwaitMessages(size_t n) {
    absl::MutexLock lock(&mu_);
    auto done = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const auto& s : streams_) {
        if (s.size() >= n) return true;
      }
      return false;
    };
    mu_.Await(absl::Condition(&done));
  }

  grpc::Status Session(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<CoordinatorMessage, TrainerMessage>* stream)
      override {
    size_t index;
    {
      absl::MutexLock lock(&mu_);
      index = streams_.size();
      streams_.emplace_back();
    }
    if (script_ == Script::kJobNotFound)
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "job j not found");
    auto read = [&] {
      TrainerMessage m;
      if (!stream->Read(&m)) return false;
      absl::MutexLock lock(&mu_);
      streams_[index].push_back(TrainerMessage::descriptor()
                                    ->FindFieldByNumber(m.msg_case())
                                    ->name());
      return true;
    };
    if (!read()) return grpc::Status::OK;  // the Hello
    CoordinatorMessage welcome;
    welcome.mutable_welcome()->set_world_size(1);
    stream->Write(welcome);
    if (script_ == Script::kWelcomeThenEnd) return grpc::Status::OK;
    read();  // the Want
    CoordinatorMessage m;
    m.mutable_epoch_begin()->set_epoch(0);
    stream->Write(m);
    m.mutable_epoch_end()->set_epoch(0);
    stream->Write(m);
    read();
    return grpc::Status::OK;
  }

 private:
  const Script script_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  absl::Mutex mu_;
  std::vector<std::vector<std::string>> streams_ ABSL_GUARDED_BY(mu_);
};

// A loopback address bound but not listening while it lives: connecting
// is refused.
struct RefusingAddress {
  RefusingAddress() {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      address = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
    }
  }
  ~RefusingAddress() {
    if (fd >= 0) close(fd);
  }
  RefusingAddress(const RefusingAddress&) = delete;
  RefusingAddress& operator=(const RefusingAddress&) = delete;
  int fd = -1;
  std::string address;
};

// The test as the session's handler: what it was told, in order.
class CoordinatorSessionTest : public ::testing::Test, public SessionHandler {
 protected:
  void SetUp() override { loop_.Start(); }
  void TearDown() override {
    {
      absl::MutexLock lock(&mu_);
      wanted_ = false;
    }
    if (session_ != nullptr) session_->Stop();
    session_.reset();
    loop_.Shutdown();
  }

  void Start(const std::string& address) {
    options_.coordinator = address;
    options_.reconnect_timeout = absl::Seconds(30);
    session_ =
        std::make_unique<CoordinatorSession>(options_, &loop_, &clock_, this);
    session_->Start();
  }
  // Waits until `n` events were told.
  void AwaitEvents(size_t n) {
    absl::MutexLock lock(&mu_);
    auto done = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return events_.size() >= n;
    };
    mu_.Await(absl::Condition(&done));
  }
  std::vector<std::string> events() {
    absl::MutexLock lock(&mu_);
    return events_;
  }

  // SessionHandler.
  bool SessionWanted() override {
    absl::MutexLock lock(&mu_);
    ++wanted_asked_;
    return wanted_;
  }
  // Waits until the session asked whether it is wanted `n` times.
  void AwaitAsked(int n) {
    absl::MutexLock lock(&mu_);
    auto done = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return wanted_asked_ >= n;
    };
    mu_.Await(absl::Condition(&done));
  }
  int asked() {
    absl::MutexLock lock(&mu_);
    return wanted_asked_;
  }
  absl::Duration LeaseTtl() override { return absl::Seconds(10); }
  void OpeningMessages(TrainerMessage* hello, TrainerMessage* want) override {
    hello->mutable_hello()->set_job("j");
    want->mutable_want()->set_credits(2);
  }
  void StreamOpen(bool open) override { Tell(open ? "open" : "closed"); }
  void Welcomed(const CoordinatorMessage&) override { Tell("welcome"); }
  void Received(const CoordinatorMessage& m) override {
    Tell(CoordinatorMessage::descriptor()
             ->FindFieldByNumber(m.msg_case())
             ->name());
  }
  void Failed(absl::Status status) override {
    {
      absl::MutexLock lock(&mu_);
      wanted_ = false;
    }
    Tell(absl::StrCat("failed: ", status.ToString()));
  }
  void Tell(std::string event) {
    absl::MutexLock lock(&mu_);
    events_.push_back(std::move(event));
  }

  ReaderOptions options_;
  testing::FakeClock clock_;
  CompletionLoop loop_;
  std::unique_ptr<CoordinatorSession> session_;
  absl::Mutex mu_;
  bool wanted_ ABSL_GUARDED_BY(mu_) = true;
  int wanted_asked_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> events_ ABSL_GUARDED_BY(mu_);
};

TEST_F(CoordinatorSessionTest, HelloAndWantGoFirstAndMessagesArriveInOrder) {
  ScriptedCoordinator coordinator(
      ScriptedCoordinator::Script::kWelcomeThenOneMore);
  Start(coordinator.address());
  AwaitEvents(4);
  {
    absl::MutexLock lock(&mu_);
    wanted_ = false;  // the stream's end ends the session
  }
  TrainerMessage beat;
  beat.mutable_heartbeat();
  EXPECT_TRUE(session_->Send(beat));
  coordinator.AwaitMessages(3);
  AwaitEvents(5);
  EXPECT_THAT(events(), ElementsAre("open", "welcome", "epoch_begin",
                                    "epoch_end", "closed"));
  EXPECT_THAT(coordinator.streams(),
              ElementsAre(ElementsAre("hello", "want", "heartbeat")));
  EXPECT_EQ(session_->reconnects(), 0);
}

TEST_F(CoordinatorSessionTest, NothingIsBuiltOrSentWithoutAStream) {
  RefusingAddress nobody;
  ASSERT_FALSE(nobody.address.empty());
  Start(nobody.address);
  bool built = false;
  EXPECT_FALSE(session_->Send([&built](TrainerMessage*) { built = true; }));
  EXPECT_FALSE(built);
}

TEST_F(CoordinatorSessionTest, AWelcomedStreamThatEndsIsOpenedAgain) {
  ScriptedCoordinator coordinator(ScriptedCoordinator::Script::kWelcomeThenEnd);
  Start(coordinator.address());
  AwaitEvents(6);  // open, welcome, closed, open, welcome, closed
  {
    absl::MutexLock lock(&mu_);
    wanted_ = false;
  }
  session_->Stop();
  const std::vector<std::string> told = events();
  EXPECT_THAT(
      std::vector<std::string>(told.begin(), told.begin() + 6),
      ElementsAre("open", "welcome", "closed", "open", "welcome", "closed"));
  EXPECT_GE(session_->reconnects(), 1);
  for (const auto& stream : coordinator.streams()) {
    ASSERT_FALSE(stream.empty());
    EXPECT_EQ(stream.front(), "hello");
  }
}

TEST_F(CoordinatorSessionTest, AStatusReconnectingCannotHelpEndsTheSession) {
  ScriptedCoordinator coordinator(ScriptedCoordinator::Script::kJobNotFound);
  Start(coordinator.address());
  AwaitEvents(3);
  EXPECT_THAT(events(), ElementsAre("open", "closed",
                                    "failed: NOT_FOUND: job j not found"));
  session_->Stop();
  EXPECT_EQ(coordinator.streams().size(), 1u);
}

TEST_F(CoordinatorSessionTest, AnUnreachableCoordinatorFailsAfterTheTimeout) {
  RefusingAddress nobody;
  ASSERT_FALSE(nobody.address.empty());
  Start(nobody.address);
  // The session asks first after it noted when the coordinator became
  // unreachable; each failed attempt asks twice, the second time just
  // before comparing the time unreachable with the timeout.
  AwaitAsked(1);
  clock_.Advance(options_.reconnect_timeout);
  AwaitAsked(asked() + 3);
  EXPECT_TRUE(events().empty());  // exactly the timeout: it keeps trying
  clock_.Advance(absl::Milliseconds(1));
  AwaitEvents(1);
  EXPECT_THAT(events(),
              ElementsAre(HasSubstr("UNAVAILABLE: coordinator 127.0.0.1:")));
  EXPECT_THAT(events()[0], HasSubstr("unreachable for 30s"));
}

}  // namespace
}  // namespace sluice::client_internal
