#include "server/format/tar_shard_reader.h"

#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tar_writer.h"
#include "tests/testing/temp_dir.h"

namespace sluice::dataserver {
namespace {

using ::sluice::testing::TarWriter;
using ::sluice::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kReference[] =
    SLUICE_SOURCE_DIR "/tests/testing/webdataset_reference.py";

std::string RunReference(const std::string& mode, const std::string& path) {
  std::string command =
      absl::StrCat("/usr/bin/python3 ", kReference, " ", mode, " ", path);
  FILE* pipe = popen(command.c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  EXPECT_EQ(pclose(pipe), 0) << command;
  return out;
}

std::shared_ptr<const ShardData> Shard(std::string bytes) {
  return ShardData::FromString(std::move(bytes), "test.tar");
}

// Every sample of a shard, read front to back, as the reference prints it.
std::string ReadAllAsReference(const std::shared_ptr<const ShardData>& shard) {
  auto index = std::make_shared<const ShardIndex>(BuildShardIndex(shard));
  EXPECT_EQ(index->damage, "");
  auto reader = TarSampleReader::Open(shard, index, 0);
  EXPECT_OK(reader.status());
  std::string out;
  while (true) {
    auto sample = (*reader)->Next();
    EXPECT_OK(sample.status());
    if (!sample.ok() || !sample->has_value()) break;
    std::string line = absl::BytesToHexString((*sample)->key);
    if (!(*sample)->corrupt.empty()) line += " !duplicate";
    for (const RawField& f : (*sample)->fields) {
      absl::StrAppend(&line, " ", absl::BytesToHexString(f.name), "=",
                      absl::BytesToHexString(f.data.bytes));
    }
    out += line + "\n";
  }
  return out;
}

TEST(SplitMemberNameTest, WebDatasetExamples) {
  auto split = [](absl::string_view path) {
    auto name = SplitMemberName(path);
    return name ? name->key + "|" + name->field : std::string("-");
  };
  EXPECT_EQ(split("a/b/x.seg.png"), "a/b/x|seg.png");
  EXPECT_EQ(split("x.JPG"), "x|jpg");
  EXPECT_EQ(split("x"), "-");
  EXPECT_EQ(split(".hidden"), "-");
  EXPECT_EQ(split("dir/.hidden"), "dir/|hidden");
  EXPECT_EQ(split("a.b/c.d"), "a.b/c|d");
  EXPECT_EQ(split("a.b/.c"), "-");
  EXPECT_EQ(split("__meta__"), "-");
  EXPECT_EQ(split("__x__/y.txt"), "-");
  EXPECT_EQ(split("x/__y__.txt"), "x/__y__|txt");
}

// Our split agrees with Python's re on webdataset's own regex for thousands
// of generated names built from the characters that matter.
TEST(SplitMemberNameTest, MatchesPythonRegexOnGeneratedNames) {
  std::mt19937 rng(7);
  const std::string alphabet = "ab._/_X\n";
  std::vector<std::string> names = {"a/b/x.seg.png", "dir/.hidden", "a.b/.c",
                                    "__x__",         "__x__/y.z",   "___",
                                    "____/a.b",      "a//.b",       "./a.b"};
  for (int i = 0; i < 3000; ++i) {
    std::string name;
    int len = 1 + static_cast<int>(rng() % 12);
    for (int j = 0; j < len; ++j) name += alphabet[rng() % alphabet.size()];
    names.push_back(name);
  }
  TempDir dir;
  std::string list;
  for (const std::string& n : names) list += absl::BytesToHexString(n) + "\n";
  testing::WriteFile(dir.File("names"), list);
  std::vector<std::string> expected = absl::StrSplit(
      RunReference("split", dir.File("names")), '\n', absl::SkipEmpty());
  ASSERT_EQ(expected.size(), names.size());
  int mismatches = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    auto name = SplitMemberName(names[i]);
    std::string got = name ? absl::BytesToHexString(name->key) + " " +
                                 absl::BytesToHexString(name->field)
                           : "-";
    if (got != expected[i] && ++mismatches < 10) {
      ADD_FAILURE() << "name \"" << absl::CEscape(names[i]) << "\": ours "
                    << got << ", webdataset " << expected[i];
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// The tricky layout: multi-dot fields, directories, a key that comes back
// later, empty members, GNU and pax long names, symlinks, meta files,
// duplicate fields.
std::string TrickyTar(TarWriter::LongNames style) {
  const std::string long_dir(120, 'd');
  TarWriter tar(style);
  tar.Directory("train/")
      .File("__meta__", "ignored")
      .File("train/0001.jpg", "JPEG-1")
      .File("train/0001.cls", "3")
      .File("train/0001.seg.png", "PNG-1")
      .File("train/0002.jpg", "")
      .File("train/0002.json", "{}")
      .Symlink("train/0002.txt", "0001.cls")
      .File("train/0001.txt", "again")  // key reappears: a new sample
      .File(long_dir + "/0003.jpg", "long")
      .File(long_dir + "/0003.cls", "4")
      .PaxFile("train/0004.Jpg", "pax")
      .File("noext", "skipped")
      .File("train/0005.a.b.c", "multi")
      .File("train/0006.cls", "1")
      .File("train/0006.cls", "2");  // duplicate field
  return tar.Finish();
}

class GroupingTest : public ::testing::TestWithParam<TarWriter::LongNames> {};

TEST_P(GroupingTest, MatchesWebDataset) {
  TempDir dir;
  std::string tar = TrickyTar(GetParam());
  testing::WriteFile(dir.File("tricky.tar"), tar);
  std::string expected = RunReference("group", dir.File("tricky.tar"));
  std::string got = ReadAllAsReference(Shard(tar));
  EXPECT_EQ(got, expected);
  // And what that means, spelled out:
  std::vector<std::string> lines = absl::StrSplit(got, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 7u);
  EXPECT_THAT(lines[2], HasSubstr(absl::BytesToHexString("train/0001")));
  EXPECT_THAT(lines[6], HasSubstr("!duplicate"));
}

INSTANTIATE_TEST_SUITE_P(LongNames, GroupingTest,
                         ::testing::Values(TarWriter::LongNames::kGnu,
                                           TarWriter::LongNames::kPax));

TEST(ShardIndexTest, RecordsOffsetsSizesAndKeys) {
  TarWriter tar;
  size_t first = tar.offset();
  tar.File("a.jpg", std::string(1000, 'x')).File("a.cls", "7");
  size_t second = tar.offset();
  tar.PaxFile("b.jpg", "yy");
  ShardIndex index = BuildShardIndex(Shard(tar.Finish()));
  EXPECT_TRUE(index.seekable);
  EXPECT_EQ(index.damage, "");
  ASSERT_EQ(index.num_samples(), 2);
  EXPECT_EQ(index.samples[0].key, "a");
  EXPECT_EQ(index.samples[0].offset, static_cast<int64_t>(first));
  EXPECT_EQ(index.samples[0].bytes, 1001);
  EXPECT_EQ(index.samples[1].key, "b");
  // The pax header that carries b's path is where b starts.
  EXPECT_EQ(index.samples[1].offset, static_cast<int64_t>(second));
}

std::string SampleShard(int samples, bool pax_every_third) {
  TarWriter tar;
  for (int i = 0; i < samples; ++i) {
    std::string key = absl::StrCat("s/", i);
    if (pax_every_third && i % 3 == 0) {
      tar.PaxFile(key + ".bin",
                  std::string(static_cast<size_t>(i % 700), 'a' + i % 26));
    } else {
      tar.File(key + ".bin",
               std::string(static_cast<size_t>(i % 700), 'a' + i % 26));
    }
    tar.File(key + ".cls", std::to_string(i));
  }
  return tar.Finish();
}

std::vector<std::string> Describe(TarSampleReader& reader, int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    auto sample = reader.Next();
    if (!sample.ok() || !sample->has_value()) break;
    std::string d = absl::StrCat((*sample)->index, ":", (*sample)->key);
    for (const RawField& f : (*sample)->fields) {
      absl::StrAppend(&d, ",", f.name, "=", f.data.bytes);
    }
    out.push_back(d);
  }
  return out;
}

// Reading [k, k+10) through the index returns exactly what a full scan has
// at positions k..k+9, for every k of a 1,000-sample shard.
TEST(TarSampleReaderTest, SeekMatchesFullScanForEveryStart) {
  auto shard = Shard(SampleShard(1000, true));
  auto index = std::make_shared<const ShardIndex>(BuildShardIndex(shard));
  ASSERT_EQ(index->num_samples(), 1000);
  ASSERT_TRUE(index->seekable);
  auto full_reader = TarSampleReader::Open(shard, index, 0);
  ASSERT_OK(full_reader.status());
  std::vector<std::string> full = Describe(**full_reader, 1000);
  ASSERT_EQ(full.size(), 1000u);
  for (int k = 0; k < 1000; ++k) {
    auto reader = TarSampleReader::Open(shard, index, k);
    ASSERT_OK(reader.status());
    std::vector<std::string> got = Describe(**reader, 10);
    std::vector<std::string> want(full.begin() + k,
                                  full.begin() + std::min(1000, k + 10));
    ASSERT_EQ(got, want) << "k=" << k;
  }
}

TEST(TarSampleReaderTest, UncompressedDataIsNotCopied) {
  auto shard = Shard(SampleShard(5, false));
  auto index = std::make_shared<const ShardIndex>(BuildShardIndex(shard));
  auto reader = TarSampleReader::Open(shard, index, 2);
  ASSERT_OK(reader.status());
  auto sample = (*reader)->Next();
  ASSERT_OK(sample.status());
  const RawField& f = (**sample).fields[0];
  EXPECT_GE(f.data.bytes.data(), shard->bytes().data());
  EXPECT_LE(f.data.bytes.data() + f.data.bytes.size(),
            shard->bytes().data() + shard->bytes().size());
}

TEST(TarSampleReaderTest, GzipShardsAreReadFromTheStart) {
  std::string plain = SampleShard(50, true);
  auto gz = Shard(testing::Gzip(plain));
  auto index = std::make_shared<const ShardIndex>(BuildShardIndex(gz));
  EXPECT_FALSE(index->seekable);
  ASSERT_EQ(index->num_samples(), 50);
  auto plain_shard = Shard(plain);
  auto plain_index =
      std::make_shared<const ShardIndex>(BuildShardIndex(plain_shard));
  for (int k : {0, 1, 17, 45, 49}) {
    auto a = TarSampleReader::Open(gz, index, k);
    auto b = TarSampleReader::Open(plain_shard, plain_index, k);
    ASSERT_OK(a.status());
    ASSERT_OK(b.status());
    EXPECT_EQ(Describe(**a, 10), Describe(**b, 10)) << "k=" << k;
  }
}

// A compressed member larger than the cap (a gzip bomb: a few KB holding
// megabytes of zeros) makes its sample corrupt instead of being held in
// memory; the samples around it are read as usual.
TEST(TarSampleReaderTest,
     AnOversizedCompressedMemberIsACorruptSampleNotABuffer) {
  TarWriter tar;
  tar.File("a.cls", "1");
  tar.File("b.bin", std::string(8 << 20, '\0'));
  tar.File("b.cls", "2");
  tar.File("c.cls", "3");
  auto gz = Shard(testing::Gzip(tar.Finish()));
  ASSERT_LT(gz->size(), 64u << 10);
  auto index = std::make_shared<const ShardIndex>(BuildShardIndex(gz));
  ASSERT_EQ(index->num_samples(), 3);
  auto reader =
      TarSampleReader::Open(gz, index, 0, /*max_member_bytes=*/1 << 20);
  ASSERT_OK(reader.status());
  std::vector<std::string> keys, corrupt;
  std::vector<SampleDamage> damage;
  while (true) {
    auto sample = (*reader)->Next();
    ASSERT_OK(sample.status());
    if (!sample->has_value()) break;
    keys.push_back((**sample).key);
    corrupt.push_back((**sample).corrupt);
    damage.push_back((**sample).damage);
    if ((**sample).key != "b") {
      EXPECT_EQ((**sample).fields.size(), 1u);
    }
  }
  EXPECT_EQ(keys, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(corrupt[0], "");
  EXPECT_THAT(corrupt[1], HasSubstr("member \"b.bin\""));
  EXPECT_THAT(corrupt[1], HasSubstr("is 8388608 bytes; the limit is 1048576"));
  EXPECT_EQ(corrupt[2], "");
  EXPECT_EQ(damage, (std::vector<SampleDamage>{SampleDamage::kNone,
                                               SampleDamage::kDamagedTar,
                                               SampleDamage::kNone}));
}

// Two members of one sample with the same extension: the sample is corrupt
// as webdataset's "duplicate file name" error, of its own kind; its
// neighbours are whole.
TEST(TarSampleReaderTest, ADuplicateFieldIsItsOwnKindOfDamage) {
  TarWriter tar;
  tar.File("a.cls", "1")
      .File("b.cls", "2")
      .File("b.cls", "3")
      .File("c.cls", "4");
  auto shard = Shard(tar.Finish());
  auto index = std::make_shared<const ShardIndex>(BuildShardIndex(shard));
  ASSERT_EQ(index->num_samples(), 3);
  EXPECT_EQ(index->samples[1].damage, SampleDamage::kDuplicateField);
  EXPECT_THAT(index->samples[1].corrupt, HasSubstr("duplicate field \"cls\""));
  auto reader = TarSampleReader::Open(shard, index, 0);
  ASSERT_OK(reader.status());
  std::vector<SampleDamage> damage;
  while (true) {
    auto sample = (*reader)->Next();
    ASSERT_OK(sample.status());
    if (!sample->has_value()) break;
    damage.push_back((**sample).damage);
  }
  EXPECT_EQ(damage, (std::vector<SampleDamage>{SampleDamage::kNone,
                                               SampleDamage::kDuplicateField,
                                               SampleDamage::kNone}));
}

TEST(TarSampleReaderTest, BeginPastTheEndIsOutOfRange) {
  auto shard = Shard(SampleShard(3, false));
  auto index = std::make_shared<const ShardIndex>(BuildShardIndex(shard));
  EXPECT_THAT(
      TarSampleReader::Open(shard, index, 4).status(),
      testing::StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("3 samples")));
  auto at_end = TarSampleReader::Open(shard, index, 3);
  ASSERT_OK(at_end.status());
  auto none = (*at_end)->Next();
  ASSERT_OK(none.status());
  EXPECT_FALSE(none->has_value());
}

TEST(TarSampleReaderTest, MemberWhoseSizeLiesIsCorruptNotACrash) {
  TarWriter tar;
  tar.File("a.bin", "aaaa").File("b.bin", std::string(600, 'b'));
  std::string bytes = tar.Finish();
  // Claim b.bin holds 1 MiB: the archive ends long before.
  std::string& s = bytes;
  size_t header_b = 1024;  // a's header + one data block
  std::snprintf(&s[header_b + 124], 12, "%011o", 1 << 20);
  std::memset(&s[header_b + 148], ' ', 8);
  unsigned sum = 0;
  for (size_t i = 0; i < 512; ++i)
    sum += static_cast<unsigned char>(s[header_b + i]);
  std::snprintf(&s[header_b + 148], 8, "%06o", sum);
  auto shard = Shard(bytes);
  auto index = std::make_shared<const ShardIndex>(BuildShardIndex(shard));
  EXPECT_THAT(index->damage, HasSubstr("b.bin"));
  ASSERT_EQ(index->num_samples(), 2);
  EXPECT_EQ(index->samples[0].corrupt, "");
  EXPECT_THAT(index->samples[1].corrupt, HasSubstr("test.tar"));
  EXPECT_EQ(index->samples[1].damage, SampleDamage::kDamagedTar);
  auto reader = TarSampleReader::Open(shard, index, 0);
  ASSERT_OK(reader.status());
  auto a = (*reader)->Next();
  ASSERT_OK(a.status());
  EXPECT_EQ((*a)->fields[0].data.bytes, "aaaa");
  auto b = (*reader)->Next();
  ASSERT_OK(b.status());
  EXPECT_THAT((*b)->corrupt, HasSubstr("b.bin"));
  EXPECT_EQ((*b)->damage, SampleDamage::kDamagedTar);
  EXPECT_TRUE((*b)->fields.empty());
}

// Truncation at every 512-byte boundary: never a crash or a hang; every
// sample the index still lists whole reads back byte for byte.
TEST(TarSampleReaderTest, TruncatedAtEveryBlockBoundary) {
  std::string full = SampleShard(12, true);
  auto full_shard = Shard(full);
  auto full_index =
      std::make_shared<const ShardIndex>(BuildShardIndex(full_shard));
  auto full_reader = TarSampleReader::Open(full_shard, full_index, 0);
  ASSERT_OK(full_reader.status());
  std::vector<std::string> whole = Describe(**full_reader, 100);
  for (size_t cut = 0; cut <= full.size(); cut += 512) {
    auto shard = Shard(full.substr(0, cut));
    auto index = std::make_shared<const ShardIndex>(BuildShardIndex(shard));
    ASSERT_LE(index->num_samples(), 12);
    if (cut > 0 && cut + 1024 <= full.size()) {  // 0 bytes = empty shard
      EXPECT_NE(index->damage, "") << "cut=" << cut << " went unnoticed";
    }
    auto reader = TarSampleReader::Open(shard, index, 0);
    ASSERT_OK(reader.status());
    for (int64_t i = 0; i < index->num_samples(); ++i) {
      auto sample = (*reader)->Next();
      ASSERT_OK(sample.status()) << "cut=" << cut;
      ASSERT_TRUE(sample->has_value());
      if ((*sample)->corrupt.empty()) {
        std::string d = absl::StrCat((*sample)->index, ":", (*sample)->key);
        for (const RawField& f : (*sample)->fields) {
          absl::StrAppend(&d, ",", f.name, "=", f.data.bytes);
        }
        // A sample cut short must be flagged, never served partially.
        EXPECT_EQ(d, whole[i]) << "cut=" << cut;
      }
    }
  }
}

// Damage anywhere: the reader returns samples, the end, or DATA_LOSS, never
// anything else (and never more samples than the index found); over the
// rounds every outcome occurs.
TEST(TarSampleReaderTest, RandomByteFlipsEndInSamplesOrDataLoss) {
  std::string full = SampleShard(20, true);
  std::mt19937 rng(11);
  std::map<std::string, int> outcomes;
  for (int round = 0; round < 300; ++round) {
    std::string bytes = full;
    for (int flips = 0; flips < 4; ++flips) {
      bytes[rng() % bytes.size()] ^= static_cast<char>(1 + rng() % 255);
    }
    auto shard = Shard(bytes);
    auto index = std::make_shared<const ShardIndex>(BuildShardIndex(shard));
    auto reader = TarSampleReader::Open(shard, index, 0);
    if (!reader.ok()) {
      EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss)
          << reader.status();
      ++outcomes["open: data loss"];
      continue;
    }
    int64_t read = 0;
    for (int i = 0; i < 40; ++i) {
      auto sample = (*reader)->Next();
      if (!sample.ok()) {
        EXPECT_EQ(sample.status().code(), absl::StatusCode::kDataLoss)
            << sample.status();
        ++outcomes["read: data loss"];
        break;
      }
      if (!sample->has_value()) {
        ++outcomes[index->damage.empty() ? "clean end" : "end after damage"];
        break;
      }
      ++read;
    }
    EXPECT_LE(read, index->num_samples());
  }
  EXPECT_GT(outcomes["clean end"] + outcomes["end after damage"], 0);
  EXPECT_GT(outcomes["open: data loss"] + outcomes["read: data loss"] +
                outcomes["end after damage"],
            0);
}

TEST(TarSampleReaderTest, NotATarIsDamage) {
  ShardIndex index = BuildShardIndex(Shard(std::string(2048, 'z')));
  EXPECT_EQ(index.num_samples(), 0);
  EXPECT_THAT(index.damage, HasSubstr("test.tar"));
}

TEST(TarSampleReaderTest, EmptyFileIsAnEmptyShard) {
  ShardIndex index = BuildShardIndex(Shard(""));
  EXPECT_EQ(index.num_samples(), 0);
  EXPECT_EQ(index.damage, "");
}

}  // namespace
}  // namespace sluice::dataserver
