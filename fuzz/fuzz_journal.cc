// The job journal's reader (src/common/journal.h, Journal::ReadAll) on any file, and what the
// master rebuilds from it that lives in typed form: the shard table (src/master/shard_table.h,
// ShardTable::Replay, which applies each record as the live path does). A journal is
// written by Shoal, but a crash can leave any torn tail, and a disk or a person any bytes.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/journal.h"
#include "master/shard_table.h"

namespace {

std::string JournalPath() {
  static const std::string path = [] {
    const char* tmp = std::getenv("TMPDIR");
    return std::string(tmp != nullptr ? tmp : "/tmp") + "/shoal-fuzz-journal-" +
           std::to_string(::getpid()) + ".jsonl";
  }();
  return path;
}

shoal::spec::DatasetConfig RangeDataset() {
  shoal::spec::DatasetConfig dataset;
  dataset.samples = 10;
  dataset.shard_size = 3;
  dataset.epochs = 2;
  dataset.configured = true;
  return dataset;
}

shoal::spec::DatasetConfig FileDataset() {
  shoal::spec::DatasetConfig dataset;
  dataset.files = {"a.txt", "b.txt"};
  dataset.epochs = 1;
  dataset.configured = true;
  return dataset;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = JournalPath();
  FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, file) != size) std::abort();
  std::fclose(file);
  auto records = shoal::Journal::ReadAll(path);
  ::unlink(path.c_str());
  if (!records.ok()) std::abort();  // the file is there and readable
  shoal::Clock::TimePoint now{};
  for (const auto& dataset : {RangeDataset(), FileDataset()}) {
    // Replay stops at the first record that does not fit, as the master does.
    (void)shoal::master::ShardTable::Replay(dataset, *records, now);
  }
  return 0;
}
