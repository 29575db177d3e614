#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shoal::master {

// The files of a Parquet dataset (`dataset: {parquet: ...}`), one shard each, in the order they
// are handed out: sorted by name, as Spark numbers its part files.
//
// `location` is an absolute local path or hdfs://namenode[:port]/path (as the spec parser leaves
// it); `webhdfs` the NameNode's HTTP address, "" for its host on port 9870. A file is listed as
// itself; a directory (what Spark's DataFrame.write.parquet leaves) as its files, leaving out
// hidden and `_`-prefixed names (`_SUCCESS`, `.part-*.crc`, `_metadata`) and `.crc` files.
// A local file is Parquet when it begins and ends with `PAR1`; over WebHDFS, where reading
// bytes means a DataNode round trip per file, when its name ends in `.parquet`.
//
// Called once, by `shoal run` before anything starts; the list is then fixed in submit.json and
// the journal (docs/job-spec.md#dataset), never listed again. Blocking (WebHDFS): never from an
// event loop. Errors, each naming the path: NotFound (missing), FailedPrecondition (empty, not
// Parquet, a partitioned directory), Unavailable (no NameNode answers).
absl::StatusOr<std::vector<std::string>> ListParquetDataset(const std::string& location,
                                                            const std::string& webhdfs);

}  // namespace shoal::master
