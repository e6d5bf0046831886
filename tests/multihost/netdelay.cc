// netdelay: holds every packet of one NFQUEUE queue for a fixed time, then
// lets it go -- a one-way link delay for kernels without sch_netem.
//
//   iptables-legacy -A OUTPUT -o eth0 -j NFQUEUE --queue-num 1 --queue-bypass
//   netdelay --queue=1 --delay_us=5000
//
// Run inside the network namespace whose rule queues the packets (queues are
// per namespace). The delay is the same for every packet, so packets leave
// in the order they came: a FIFO of packet ids, released by one batch
// verdict for all ids up to the last one due. Only the packet's metadata is
// copied to user space. The queue fails open (packets pass when it is
// full), and on SIGTERM or SIGINT every held packet is let go before exit.
// Prints "ready" on stdout once the queue is bound.

#include <arpa/inet.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <string>
#include <string_view>

namespace {

volatile std::sig_atomic_t g_stop = 0;

void OnSignal(int /*signum*/) { g_stop = 1; }

int64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

struct Held {
  uint32_t id;
  int64_t due_ns;
};

struct State {
  std::deque<Held> held;
  int64_t delay_ns = 0;
  uint64_t packets = 0;
};

int OnPacket(nfq_q_handle* /*queue*/, nfgenmsg* /*msg*/, nfq_data* data,
             void* arg) {
  auto* state = static_cast<State*>(arg);
  const nfqnl_msg_packet_hdr* header = nfq_get_msg_packet_hdr(data);
  if (header == nullptr) return 0;
  state->held.push_back({ntohl(header->packet_id), NowNs() + state->delay_ns});
  ++state->packets;
  return 0;
}

// Accepts every held packet whose time has come (all of them when `all`).
void Release(nfq_q_handle* queue, State& state, bool all) {
  const int64_t now = NowNs();
  bool any = false;
  uint32_t last = 0;
  while (!state.held.empty() && (all || state.held.front().due_ns <= now)) {
    last = state.held.front().id;
    state.held.pop_front();
    any = true;
  }
  if (any) nfq_set_verdict_batch(queue, last, NF_ACCEPT);
}

bool ParseFlag(std::string_view arg, std::string_view name, long* value) {
  const std::string prefix = "--" + std::string(name) + "=";
  if (arg.substr(0, prefix.size()) != prefix) return false;
  const std::string text(arg.substr(prefix.size()));
  char* end = nullptr;
  *value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || *value < 0) {
    std::fprintf(stderr,
                 "netdelay: --%s wants a non-negative integer, got '%s'\n",
                 std::string(name).c_str(), text.c_str());
    std::exit(2);
  }
  return true;
}

constexpr char kUsage[] =
    "usage: netdelay --queue=N --delay_us=D\n"
    "Holds every packet of NFQUEUE queue N for D microseconds, in order.\n"
    "Run it in the network namespace of the iptables rule that queues them.\n";

}  // namespace

int main(int argc, char** argv) {
  long queue_num = -1;
  long delay_us = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (ParseFlag(arg, "queue", &queue_num) ||
        ParseFlag(arg, "delay_us", &delay_us))
      continue;
    std::fprintf(stderr, "netdelay: unknown argument '%s'\n%s", argv[i],
                 kUsage);
    return 2;
  }
  if (queue_num < 0 || queue_num > 65535 || delay_us < 0) {
    std::fputs(kUsage, stderr);
    return 2;
  }

  nfq_handle* handle = nfq_open();
  if (handle == nullptr) {
    std::perror(
        "netdelay: nfq_open (needs root, CONFIG_NETFILTER_NETLINK_QUEUE)");
    return 1;
  }
  State state;
  state.delay_ns = delay_us * 1000;
  nfq_q_handle* queue = nfq_create_queue(
      handle, static_cast<uint16_t>(queue_num), &OnPacket, &state);
  if (queue == nullptr) {
    std::fprintf(stderr, "netdelay: cannot bind queue %ld: %s\n", queue_num,
                 std::strerror(errno));
    return 1;
  }
  if (nfq_set_mode(queue, NFQNL_COPY_META, 0) < 0 ||
      nfq_set_queue_maxlen(queue, 65536) < 0 ||
      nfq_set_queue_flags(queue, NFQA_CFG_F_FAIL_OPEN, NFQA_CFG_F_FAIL_OPEN) <
          0) {
    std::fprintf(stderr, "netdelay: cannot configure queue %ld: %s\n",
                 queue_num, std::strerror(errno));
    return 1;
  }
  const int fd = nfq_fd(handle);
  const int buffer_bytes = 8 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof(buffer_bytes));

  struct sigaction action {};
  action.sa_handler = &OnSignal;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  std::puts("ready");
  std::fflush(stdout);

  alignas(nlmsghdr) static char buffer[1 << 16];
  while (g_stop == 0) {
    timespec timeout{1, 0};
    if (!state.held.empty()) {
      const int64_t wait_ns =
          std::max<int64_t>(0, state.held.front().due_ns - NowNs());
      timeout = {static_cast<time_t>(wait_ns / 1'000'000'000),
                 static_cast<long>(wait_ns % 1'000'000'000)};
    }
    pollfd ready{fd, POLLIN, 0};
    const int polled = ppoll(&ready, 1, &timeout, nullptr);
    if (polled > 0) {
      for (;;) {
        const ssize_t got = recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
        if (got < 0) {
          if (errno == ENOBUFS)
            continue;  // the socket overflowed: fail-open passed them
          break;
        }
        nfq_handle_packet(handle, buffer, static_cast<int>(got));
      }
    }
    Release(queue, state, /*all=*/false);
  }
  Release(queue, state, /*all=*/true);
  std::fprintf(stderr, "netdelay: queue %ld, %lu packets delayed %ld us\n",
               queue_num, static_cast<unsigned long>(state.packets), delay_us);
  nfq_destroy_queue(queue);
  nfq_close(handle);
  return 0;
}
