#include "server/common/live_calls.h"

namespace sluice {
namespace {

// Lives as long as its call: gRPC destroys a call's interceptors with it.
class CountingInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit CountingInterceptor(LiveCalls* calls) : calls_(calls) {
    calls_->Started();
  }
  ~CountingInterceptor() override { calls_->Finished(); }
  CountingInterceptor(const CountingInterceptor&) = delete;
  CountingInterceptor& operator=(const CountingInterceptor&) = delete;

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    methods->Proceed();
  }

 private:
  LiveCalls* const calls_;
};

class CountingFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CountingFactory(LiveCalls* calls) : calls_(calls) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* /*info*/) override {
    return new CountingInterceptor(calls_);
  }

 private:
  LiveCalls* const calls_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
LiveCalls::InterceptorFactory() {
  return std::make_unique<CountingFactory>(this);
}

void LiveCalls::Started() {
  absl::MutexLock lock(&mu_);
  ++live_;
}

void LiveCalls::Finished() {
  absl::MutexLock lock(&mu_);
  --live_;
}

int64_t LiveCalls::live() const {
  absl::MutexLock lock(&mu_);
  return live_;
}

bool LiveCalls::AwaitNoneLive(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return live_ == 0 || stopped_;
  };
  mu_.AwaitWithDeadline(absl::Condition(&settled), deadline);
  return live_ == 0;
}

void LiveCalls::Stop() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
}

bool LiveCalls::AwaitStopped(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithDeadline(absl::Condition(&stopped_), deadline);
  return stopped_;
}

bool LiveCalls::stopped() const {
  absl::MutexLock lock(&mu_);
  return stopped_;
}

}  // namespace sluice
