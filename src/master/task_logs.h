#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"

namespace shoal::master {

// One output stream of one attempt of a task.
struct TaskStreamId {
  std::string task;  // "role:index"
  uint32_t attempt = 0;
  bool is_stderr = false;
  auto operator<=>(const TaskStreamId&) const = default;
};

// How far a stream's output is in the job's files, and which agent sent it (the one to tell).
struct CommittedOutput {
  TaskStreamId stream;
  uint64_t offset = 0;
  std::string source;
};

// A job's task output as the master keeps it: each task's raw streams in
// `<job dir>/tasks/<role>-<index>/{stdout,stderr}` (created on first output), and `logs.txt`,
// whole lines prefixed "role:index | " in arrival order (what `shoal run` shows and `shoal logs`
// reads). Lines are assembled per task and stream; a line longer than kMaxLine without a
// newline is cut, so a task cannot grow the master's memory without bound.
//
// Nothing is lost or written twice when the master is killed (docs/design/0002): every chunk
// says where it starts in its stream, so output an agent sends again is skipped, and each
// flush first appends to `logs.positions` how far every changed stream and file will then be,
// then writes the raw files, then logs.txt. A stream's position is the end of its last whole
// line in logs.txt; the raw file has every byte at once, and its own position, so a partial
// line the master held when it died is not written to it twice. A master that opens the job
// again reads the last record whose logs.txt write completed, cuts what an interrupted flush
// left, and so knows where each stream's output must continue; the agents keep what they sent
// past the positions it acknowledged (TakeCommitted) and send it again.
//
// Owned by the master's loop; not thread-safe.
class TaskLogs {
 public:
  static constexpr size_t kMaxLine = 64 * 1024;
  // Past this size logs.positions is rewritten as one record of the whole state.
  static constexpr size_t kMaxPositionsBytes = 1 << 20;

  static absl::StatusOr<std::unique_ptr<TaskLogs>> Open(const std::string& job_dir);
  ~TaskLogs();
  TaskLogs(const TaskLogs&) = delete;
  TaskLogs& operator=(const TaskLogs&) = delete;

  // Records `data`, the bytes of `stream` from byte `offset` on, sent by agent `source`
  // (`dir_name` is "role-index"). Bytes it already has are skipped; a gap (output the agent
  // could not keep) is marked in logs.txt. Returns the whole lines it completed, prefixed.
  std::string Append(const TaskStreamId& stream, const std::string& dir_name,
                     uint64_t offset, std::string_view data, const std::string& source = "");
  // The task ended: its unfinished lines, prefixed and terminated, written to logs.txt ("" if
  // none).
  std::string FinishTask(const std::string& task);
  // Writes what the batch produced to the files (once per batch of the master's loop). False
  // when they could not take it (a full disk): that output is dropped, no position moves past
  // it, and logs.txt still ends at combined_bytes().
  bool Flush();
  // The size of logs.txt once everything written so far is flushed: whole lines only.
  uint64_t combined_bytes() const { return combined_bytes_; }
  // The positions that flushes moved since the last call, for the agents that sent the output.
  std::vector<CommittedOutput> TakeCommitted();
  // Bytes at the end of logs.txt that Open removed: an interrupted flush's (normally 0).
  uint64_t cut_at_open() const { return cut_at_open_; }

 private:
  struct StreamState {
    uint64_t received = 0;   // the stream's bytes taken so far (in lines or the partial line)
    uint64_t committed = 0;  // the end of its last whole line in logs.txt or pending for it
    uint64_t flushed = 0;    // the same, as the last successful flush left it
    uint64_t raw = 0;        // the end of what the raw file has or will get with the next flush
    uint64_t raw_flushed = 0;
    std::string source;
  };
  struct Sink {
    std::string dir_name;
    int fd[2] = {-1, -1};          // the raw stdout and stderr files
    uint64_t size[2] = {0, 0};     // their sizes once flushed
    std::string pending[2];        // raw bytes for the next flush
    std::string partial[2];        // the unfinished line of each stream
    uint32_t partial_attempt[2] = {0, 0};
  };
  TaskLogs(std::string job_dir, int combined_fd, uint64_t size);
  Sink& SinkFor(const std::string& task, const std::string& dir_name);
  // Moves the partial line of one stream of `sink` into logs.txt and the raw file; returns the
  // line as logs.txt gets it ("" if there was none).
  std::string FinishPartial(const std::string& task, Sink& sink, int stream_index);
  // `bytes` more of the stream are in whole lines of logs.txt.
  void Consume(const TaskStreamId& id, uint64_t bytes);
  // logs.positions records: the whole state as the last flush left it, and what the next
  // flush changes (pending output included).
  std::string FlushedState() const;
  std::string NextFlushRecord() const;
  absl::Status AppendPositions(const std::string& record);

  std::string job_dir_;
  int combined_fd_;
  uint64_t combined_bytes_;   // once pending_combined_ is written
  uint64_t flushed_bytes_;    // logs.txt's size now
  std::string pending_combined_;
  std::map<std::string, Sink> sinks_;  // by task
  std::map<TaskStreamId, StreamState> streams_;
  std::set<TaskStreamId> changed_;      // positions moved since the last flush
  std::set<TaskStreamId> unreported_;   // positions flushed, not yet taken for the agents
  std::set<std::string> changed_files_;  // by task, raw files that grow in the next flush
  std::map<std::string, uint64_t> flushed_files_;  // "role-index/stdout" -> size
  int positions_fd_ = -1;
  uint64_t positions_bytes_ = 0;
  uint64_t cut_at_open_ = 0;
};

}  // namespace shoal::master
