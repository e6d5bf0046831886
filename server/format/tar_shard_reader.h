// Reads WebDataset-style tar shards with libarchive and groups members into
// samples exactly as the `webdataset` Python library does:
//
//   * only regular files count (directories, symlinks, hard links skipped),
//     and names matching webdataset's meta rules ("__x__" at top level,
//     "__x__/..." anywhere at the start) are skipped;
//   * a member path splits into (key, field) by webdataset's
//     `^((?:.*/|)[^.]+)[.]([^/]*)$`: key = path up to the first "." of the
//     basename, field = the rest, lower-cased ("a/b/x.seg.PNG" -> "a/b/x",
//     "seg.png"); a path that does not match is skipped;
//   * consecutive members with the same key form one sample; a key that
//     reappears later starts a new sample; a field repeated within a sample
//     makes the sample corrupt (webdataset raises).
//
// Member data is handed out as views into the shard's mapping when the tar
// is uncompressed (no copy), or as owned buffers otherwise.
#ifndef SLUICE_SERVER_FORMAT_TAR_SHARD_READER_H_
#define SLUICE_SERVER_FORMAT_TAR_SHARD_READER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/format/sample_index.h"
#include "server/format/shard_store.h"

struct archive;

namespace sluice::dataserver {

// Largest member of a compressed shard held in memory (--max_sample_bytes).
inline constexpr int64_t kDefaultMaxSampleBytes = int64_t{256} << 20;

struct MemberName {
  std::string key;
  std::string field;
};

// webdataset's split of a member path; nullopt = not part of any sample.
std::optional<MemberName> SplitMemberName(absl::string_view path);

// A payload: a view plus whatever keeps the bytes alive.
struct Payload {
  absl::string_view bytes;
  std::shared_ptr<const void> owner;
};

struct RawField {
  std::string name;
  Payload data;
};

struct RawSample {
  std::string key;
  int64_t index = 0;
  std::vector<RawField> fields;
  // Non-empty: the sample cannot be served; says why (shard and member).
  std::string corrupt;
  SampleDamage damage = SampleDamage::kNone;  // set with `corrupt`
};

// Scans `shard` once (headers only; data is skipped) into an index. Damage
// stops the scan and is recorded in the index, not returned as an error.
ShardIndex BuildShardIndex(const std::shared_ptr<const ShardData>& shard);

// Iterates tar members with libarchive from a given offset. Not thread-safe.
class TarMemberIterator {
 public:
  struct Member {
    std::string path;
    int64_t header_offset = 0;  // in the uncompressed stream
    int64_t size = 0;
    bool regular = false;
  };

  // `offset` must be a header boundary (0 or an index offset).
  static absl::StatusOr<std::unique_ptr<TarMemberIterator>> Open(
      std::shared_ptr<const ShardData> shard, int64_t offset);
  ~TarMemberIterator();

  // Next member header; nullopt at the end of the archive. DATA_LOSS names
  // the shard and where it broke.
  absl::StatusOr<std::optional<Member>> Next();
  // The current member's data (call at most once per member).
  // RESOURCE_EXHAUSTED, before holding it, when it would be copied (a
  // compressed shard) and is larger than max_copy_bytes; SkipData then
  // moves past it.
  absl::StatusOr<Payload> ReadData(const Member& member);
  void set_max_copy_bytes(int64_t bytes) { max_copy_bytes_ = bytes; }
  // Skips the current member's data, surfacing truncation now.
  absl::Status SkipData(const Member& member);
  // Valid after the first Next(): no compression filter.
  bool seekable() const;
  // Uncompressed bytes libarchive has consumed so far.
  int64_t consumed() const;

 private:
  TarMemberIterator() = default;
  absl::Status ArchiveError(absl::string_view what, absl::string_view member);

  std::shared_ptr<const ShardData> shard_;
  int64_t start_ = 0;
  int64_t pos_ = 0;  // bytes of the mapping handed to libarchive
  struct archive* archive_ = nullptr;
  bool data_consumed_ = true;
  bool at_end_ = false;  // Next() returned the end
  int64_t max_copy_bytes_ = kDefaultMaxSampleBytes;

  static long ReadCallback(struct archive*, void* self, const void** buffer);
  static int64_t SkipCallback(struct archive*, void* self, int64_t request);
};

// Samples [begin, ...) of one shard, in order, as raw member bytes.
class TarSampleReader {
 public:
  // Positions at sample `begin` (0 <= begin <= index.num_samples()),
  // seeking to its offset when the shard is seekable.
  // A member larger than max_member_bytes that would be copied (compressed
  // shards) makes its sample corrupt instead of being held in memory.
  static absl::StatusOr<std::unique_ptr<TarSampleReader>> Open(
      std::shared_ptr<const ShardData> shard,
      std::shared_ptr<const ShardIndex> index, int64_t begin,
      int64_t max_member_bytes = kDefaultMaxSampleBytes);

  // The next sample, or nullopt after the last sample the index lists.
  // A sample the index marks corrupt, or one that breaks while being read,
  // comes back with `corrupt` set and no fields; reading goes on with the
  // next sample when the archive allows it.
  absl::StatusOr<std::optional<RawSample>> Next();

 private:
  TarSampleReader() = default;
  absl::Status Reposition(int64_t sample);

  std::shared_ptr<const ShardData> shard_;
  std::shared_ptr<const ShardIndex> index_;
  std::unique_ptr<TarMemberIterator> members_;
  int64_t next_index_ = 0;
  // Group boundary lookahead: the first member of the next sample.
  std::optional<TarMemberIterator::Member> pending_;
  std::optional<MemberName> pending_name_;
  // Set after an archive error: the iterator must be reopened.
  bool broken_ = false;
  int64_t max_member_bytes_ = kDefaultMaxSampleBytes;
  // While walking a compressed shard up to `begin`: skip member data.
  bool skip_data_ = false;
};

}  // namespace sluice::dataserver

#endif  // SLUICE_SERVER_FORMAT_TAR_SHARD_READER_H_
