// sluicectl index: shards scanned into a manifest, locally or through a
// data server.
#include <fcntl.h>
#include <glob.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/cli/cli.h"
#include "nlohmann/json.hpp"
#include "server/common/grpc_status.h"
#include "server/common/sha256.h"
#include "server/common/status_macros.h"
#include "server/format/shard_store.h"
#include "server/format/tar_shard_reader.h"
#include "sluice/v1/dataserver.grpc.pb.h"

ABSL_DECLARE_FLAG(absl::Duration, timeout);
// index
ABSL_FLAG(std::string, o, "",
          "index: write the manifest here (default stdout).");
ABSL_FLAG(std::string, data_server, "",
          "index: HOST:PORT of a data server to index the shards through "
          "(IndexShard): the "
          "arguments are then shard URLs (http://, https://, s3://, or paths "
          "the server may "
          "read); remote shards land in its cache on the way. replay: the "
          "data server to ask (default: the job's live ones).");
ABSL_FLAG(std::string, url_prefix, "",
          "index (local): write each shard's URL as this prefix + its path "
          "relative to the "
          "indexed directory (e.g. https://host/shards/), for shards published "
          "remotely.");
ABSL_FLAG(bool, checksum, false,
          "index (local): record each shard's sha256 so data servers verify "
          "downloads.");

namespace sluice::cli {

// The manifest entry of `url` as the data server at `address` indexes it.
absl::StatusOr<v1::Shard> IndexThroughDataServer(v1::DataServer::Stub& stub,
                                                 const std::string& url) {
  grpc::ClientContext ctx;
  // Indexing a remote shard downloads it first: allow for that.
  ctx.set_deadline(std::chrono::system_clock::now() +
                   absl::ToChronoSeconds(std::max(absl::GetFlag(FLAGS_timeout),
                                                  absl::Minutes(10))));
  v1::IndexShardRequest request;
  request.set_url(url);
  v1::ShardIndex index;
  absl::Status s = FromGrpcStatus(stub.IndexShard(&ctx, request, &index));
  if (!s.ok())
    return absl::Status(s.code(),
                        absl::StrCat("index ", url, ": ", s.message()));
  v1::Shard shard;
  shard.set_url(url);
  shard.set_num_samples(index.num_samples());
  shard.set_size_bytes(index.size_bytes());
  return shard;
}

int IndexCommand(const std::vector<std::string>& args) {
  if (args.empty())
    return Usage(
        "index: give a directory or a glob of shards (or URLs with "
        "--data_server)");
  const std::string data_server = absl::GetFlag(FLAGS_data_server);
  std::vector<std::string> paths;
  // Local: the directory each path was found under, for --url_prefix.
  std::map<std::string, std::string> base_of;
  if (!data_server.empty()) {
    if (!absl::GetFlag(FLAGS_url_prefix).empty() ||
        absl::GetFlag(FLAGS_checksum)) {
      return Usage(
          "index: --url_prefix and --checksum index local files; not with "
          "--data_server");
    }
    paths = args;
  }
  for (const std::string& arg :
       data_server.empty() ? args : std::vector<std::string>{}) {
    struct stat st;
    std::string pattern = arg;
    std::string base;
    if (stat(arg.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      pattern = arg + "/*.tar*";
      char real[PATH_MAX];
      if (realpath(arg.c_str(), real) != nullptr) base = real;
    }
    glob_t g;
    if (glob(pattern.c_str(), 0, nullptr, &g) == 0) {
      for (size_t i = 0; i < g.gl_pathc; ++i) {
        char real[PATH_MAX];
        if (realpath(g.gl_pathv[i], real) != nullptr) {
          paths.emplace_back(real);
          std::string dir = base.empty() ? std::string(real).substr(
                                               0, std::string(real).rfind('/'))
                                         : base;
          base_of[real] = dir;
        }
      }
    }
    globfree(&g);
  }
  if (data_server.empty()) std::sort(paths.begin(), paths.end());
  if (paths.empty())
    return Fail(absl::NotFoundError("index: no shards match " +
                                    absl::StrJoin(args, " ")));
  std::unique_ptr<v1::DataServer::Stub> stub;
  if (!data_server.empty()) {
    stub = v1::DataServer::NewStub(
        grpc::CreateChannel(data_server, Credentials()));
  }
  const std::string url_prefix = absl::GetFlag(FLAGS_url_prefix);
  const bool tty = isatty(STDERR_FILENO);
  v1::Manifest manifest;
  int64_t samples = 0;
  for (size_t i = 0; i < paths.size(); ++i) {
    if (stub != nullptr) {
      absl::StatusOr<v1::Shard> shard = IndexThroughDataServer(*stub, paths[i]);
      if (!shard.ok()) return Fail(shard.status());
      samples += shard->num_samples();
      *manifest.add_shards() = *std::move(shard);
    } else {
      int fd = open(paths[i].c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0)
        return Fail(absl::NotFoundError("index: cannot open " + paths[i]));
      auto shard = dataserver::ShardData::Map(fd, paths[i]);
      if (!shard.ok()) return Fail(shard.status());
      dataserver::ShardIndex index = dataserver::BuildShardIndex(*shard);
      if (!index.damage.empty())
        return Fail(absl::DataLossError("index: " + index.damage));
      v1::Shard* s = manifest.add_shards();
      s->set_url(
          url_prefix.empty()
              ? paths[i]
              : absl::StrCat(url_prefix,
                             absl::EndsWith(url_prefix, "/") ? "" : "/",
                             paths[i].substr(base_of[paths[i]].size() + 1)));
      s->set_num_samples(index.num_samples());
      s->set_size_bytes(index.size_bytes);
      if (absl::GetFlag(FLAGS_checksum))
        s->set_checksum("sha256:" + Sha256Hex((*shard)->bytes()));
      samples += index.num_samples();
    }
    if (tty) {
      int width = 30, done = static_cast<int>(width * (i + 1) / paths.size());
      std::fprintf(stderr, "\r[%s%s] %zu/%zu shards, %lld samples",
                   std::string(done, '#').c_str(),
                   std::string(width - done, ' ').c_str(), i + 1, paths.size(),
                   static_cast<long long>(samples));
    }
  }
  if (tty) std::fprintf(stderr, "\n");
  std::string json = ToJson(manifest);
  const std::string out = absl::GetFlag(FLAGS_o);
  if (out.empty()) {
    std::printf("%s", json.c_str());
  } else {
    FILE* f = std::fopen(out.c_str(), "wb");
    if (f == nullptr ||
        std::fwrite(json.data(), 1, json.size(), f) != json.size()) {
      return Fail(absl::InternalError("index: cannot write " + out));
    }
    std::fclose(f);
  }
  std::fprintf(stderr, "indexed %zu shards, %lld samples\n", paths.size(),
               static_cast<long long>(samples));
  return kOk;
}

}  // namespace sluice::cli
