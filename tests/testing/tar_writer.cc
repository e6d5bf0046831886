#include "tests/testing/tar_writer.h"

#include <zlib.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace sluice::testing {
namespace {

void Octal(char* field, size_t width, unsigned long long value) {
  // width-1 octal digits, then NUL.
  std::snprintf(field, width, "%0*llo", static_cast<int>(width - 1), value);
}

}  // namespace

void TarWriter::Header(const std::string& name, char type, size_t size,
                       const std::string& linkname, bool gnu_magic) {
  char h[512];
  std::memset(h, 0, sizeof(h));
  std::memcpy(h, name.data(), std::min<size_t>(name.size(), 100));
  Octal(h + 100, 8, type == '5' ? 0755 : 0644);
  Octal(h + 108, 8, 0);
  Octal(h + 116, 8, 0);
  Octal(h + 124, 12, size);
  Octal(h + 136, 12, 0);
  h[156] = type;
  std::memcpy(h + 157, linkname.data(), std::min<size_t>(linkname.size(), 100));
  if (gnu_magic) {
    std::memcpy(h + 257, "ustar  ", 8);
  } else {
    std::memcpy(h + 257, "ustar", 6);
    std::memcpy(h + 263, "00", 2);
  }
  std::memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : h) sum += c;
  std::snprintf(h + 148, 8, "%06o", sum);
  h[155] = ' ';
  out_.append(h, sizeof(h));
}

void TarWriter::Data(const std::string& data) {
  out_ += data;
  out_.append((512 - data.size() % 512) % 512, '\0');
}

void TarWriter::LongName(const std::string& name, bool force_pax) {
  if (name.size() <= 100 && !force_pax) return;
  if (long_names_ == LongNames::kGnu && !force_pax) {
    std::string data = name + '\0';
    Header("././@LongLink", 'L', data.size(), "", true);
    Data(data);
    return;
  }
  // "%d path=%s\n" where %d counts the whole record, itself included.
  std::string body = " path=" + name + "\n";
  size_t len = body.size() + 1;
  while (std::to_string(len).size() + body.size() != len) ++len;
  std::string record = std::to_string(len) + body;
  Header("./PaxHeaders/entry", 'x', record.size(), "", false);
  Data(record);
}

TarWriter& TarWriter::File(const std::string& name, const std::string& data) {
  LongName(name, false);
  Header(name, '0', data.size(), "", long_names_ == LongNames::kGnu);
  Data(data);
  return *this;
}

TarWriter& TarWriter::PaxFile(const std::string& name,
                              const std::string& data) {
  LongName(name, true);
  Header(name, '0', data.size(), "", false);
  Data(data);
  return *this;
}

TarWriter& TarWriter::Directory(const std::string& name) {
  LongName(name, false);
  Header(name, '5', 0, "", long_names_ == LongNames::kGnu);
  return *this;
}

TarWriter& TarWriter::Symlink(const std::string& name,
                              const std::string& target) {
  LongName(name, false);
  Header(name, '2', 0, target, long_names_ == LongNames::kGnu);
  return *this;
}

std::string TarWriter::Finish() const { return out_ + std::string(1024, '\0'); }

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Gzip(const std::string& bytes) {
  z_stream z;
  std::memset(&z, 0, sizeof(z));
  deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&z, bytes.size()) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  z.avail_in = static_cast<uInt>(bytes.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

}  // namespace sluice::testing
