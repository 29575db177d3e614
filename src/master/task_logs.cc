#include "master/task_logs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/files.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace shoal::master {
namespace {

constexpr const char* kStreamNames[2] = {"stdout", "stderr"};

// What logs.positions says: how far each stream and raw file is once logs.txt reaches `end`.
struct Positions {
  uint64_t start = 0;  // logs.txt's size before the flush that wrote the record
  uint64_t end = 0;
  // stream -> {the end of its last whole line in logs.txt, the end of it in the raw file}
  std::map<TaskStreamId, std::pair<uint64_t, uint64_t>> streams;
  std::map<std::string, uint64_t> files;  // "role-index/stdout" -> size
};

// One record, or nullopt for a line that is not one (the torn end of an interrupted append).
std::optional<Positions> ParseRecord(absl::string_view line) {
  auto json = nlohmann::json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (!json.is_object() || !json.contains("end")) return std::nullopt;
  try {
    Positions p;
    p.start = json.at("start").get<uint64_t>();
    p.end = json.at("end").get<uint64_t>();
    for (const auto& s : json.at("streams")) {
      p.streams[{s.at(0).get<std::string>(), s.at(1).get<uint32_t>(),
                 s.at(2).get<std::string>() == "stderr"}] = {s.at(3).get<uint64_t>(),
                                                             s.at(4).get<uint64_t>()};
    }
    for (const auto& f : json.at("files")) p.files[f.at(0).get<std::string>()] = f.at(1);
    return p;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

void Merge(Positions& into, const Positions& record) {
  into.start = record.start;
  into.end = record.end;
  for (const auto& [id, offset] : record.streams) into.streams[id] = offset;
  for (const auto& [file, size] : record.files) into.files[file] = size;
}

absl::Status Truncate(const std::string& path, uint64_t size) {
  if (::truncate(path.c_str(), static_cast<off_t>(size)) != 0 && errno != ENOENT) {
    return ErrnoStatus(absl::StrCat("truncate ", path), errno);
  }
  return absl::OkStatus();
}

uint64_t SizeOf(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// Reads logs.positions and puts logs.txt and the raw files back where its last complete flush
// left them. Returns the positions to continue from and how many bytes of logs.txt it cut.
absl::StatusOr<std::pair<Positions, uint64_t>> Recover(const std::string& job_dir,
                                                       uint64_t logs_size) {
  const std::string path = job_dir + "/logs.positions";
  Positions state;
  if (::access(path.c_str(), F_OK) != 0) {
    state.start = state.end = logs_size;  // a new job (or one older than the file)
    return std::make_pair(state, uint64_t{0});
  }
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  Positions before;  // through the record before the last
  std::optional<Positions> last;
  std::vector<absl::string_view> lines = absl::StrSplit(*text, '\n', absl::SkipEmpty());
  for (size_t n = 0; n < lines.size(); ++n) {
    auto record = ParseRecord(lines[n]);
    if (record) {
      if (last) Merge(before, *last);
      last = std::move(record);
      continue;
    }
    // The last line may be an append the killed master did not finish. A bad line with
    // records after it is damage no flush leaves: cut nothing and trust none of the file.
    if (n + 1 < lines.size()) {
      spdlog::warn("{} is damaged at line {}; task output may repeat in logs.txt", path, n + 1);
      state.start = state.end = logs_size;
      return std::make_pair(state, uint64_t{0});
    }
  }
  uint64_t cut_to = logs_size;
  if (!last) {
    state.start = state.end = logs_size;
  } else if (logs_size >= last->end) {
    state = before;
    Merge(state, *last);
    cut_to = last->end;
  } else {
    // The last flush did not finish logs.txt: its raw files may have grown, its lines are
    // partly there or not at all. Back to the record before it; the agents send it again.
    for (const auto& [file, size] : last->files) {
      auto it = before.files.find(file);
      if (auto st = Truncate(absl::StrCat(job_dir, "/tasks/", file),
                             it == before.files.end() ? 0 : it->second);
          !st.ok()) {
        return st;
      }
    }
    state = before;
    state.start = state.end = std::min(last->start, logs_size);
    cut_to = state.end;
  }
  if (cut_to < logs_size) {
    if (auto st = Truncate(job_dir + "/logs.txt", cut_to); !st.ok()) return st;
  }
  return std::make_pair(state, logs_size - cut_to);
}

}  // namespace

absl::StatusOr<std::unique_ptr<TaskLogs>> TaskLogs::Open(const std::string& job_dir) {
  std::string path = job_dir + "/logs.txt";
  int combined = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (combined < 0) return ErrnoStatus("open " + path, errno);
  // A recovering master appends to its predecessor's file: offsets into it stay valid.
  auto recovered = Recover(job_dir, SizeOf(combined));
  if (!recovered.ok()) {
    ::close(combined);
    return recovered.status();
  }
  auto& [positions, cut] = *recovered;
  auto logs = std::unique_ptr<TaskLogs>(new TaskLogs(job_dir, combined, SizeOf(combined)));
  logs->cut_at_open_ = cut;
  for (const auto& [id, offsets] : positions.streams) {
    StreamState& s = logs->streams_[id];
    s.received = s.committed = s.flushed = offsets.first;
    s.raw = s.raw_flushed = offsets.second;
  }
  logs->flushed_files_ = positions.files;
  // One record of the whole state starts the file: what an interrupted flush wrote is gone.
  const std::string positions_path = job_dir + "/logs.positions";
  std::string record = logs->FlushedState();
  if (auto st = ReplaceFile(positions_path, record); !st.ok()) return st;
  logs->positions_fd_ = ::open(positions_path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (logs->positions_fd_ < 0) return ErrnoStatus("open " + positions_path, errno);
  logs->positions_bytes_ = record.size();
  return logs;
}

TaskLogs::TaskLogs(std::string job_dir, int combined_fd, uint64_t size)
    : job_dir_(std::move(job_dir)),
      combined_fd_(combined_fd),
      combined_bytes_(size),
      flushed_bytes_(size) {}

TaskLogs::~TaskLogs() {
  for (auto& [task, sink] : sinks_) {
    for (int fd : sink.fd) {
      if (fd >= 0) ::close(fd);
    }
  }
  if (positions_fd_ >= 0) ::close(positions_fd_);
  ::close(combined_fd_);
}

TaskLogs::Sink& TaskLogs::SinkFor(const std::string& task, const std::string& dir_name) {
  auto [it, created] = sinks_.try_emplace(task);
  Sink& sink = it->second;
  if (created) {
    sink.dir_name = dir_name;
    std::string dir = job_dir_ + "/tasks/" + dir_name;
    if (MakeDirs(dir).ok()) {
      for (int i = 0; i < 2; ++i) {
        sink.fd[i] = ::open(absl::StrCat(dir, "/", kStreamNames[i]).c_str(),
                            O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (sink.fd[i] >= 0) sink.size[i] = SizeOf(sink.fd[i]);
      }
    }
  }
  return sink;
}

void TaskLogs::Consume(const TaskStreamId& id, uint64_t bytes) {
  streams_[id].committed += bytes;
  changed_.insert(id);
}

std::string TaskLogs::Append(const TaskStreamId& id, const std::string& dir_name,
                             uint64_t offset, std::string_view data, const std::string& source) {
  Sink& sink = SinkFor(id.task, dir_name);
  const int i = id.is_stderr ? 1 : 0;
  std::string& partial = sink.partial[i];
  const std::string prefix = id.task + " | ";
  std::string lines;
  // The previous attempt's unterminated last line, if its end was not reported (FinishTask).
  if (sink.partial_attempt[i] != id.attempt) lines += FinishPartial(id.task, sink, i);
  StreamState& s = streams_[id];
  if (!source.empty()) s.source = source;
  if (offset + data.size() <= s.received) return lines;  // sent again: already here
  if (offset < s.received) {
    data.remove_prefix(s.received - offset);
  } else if (offset > s.received) {
    lines += FinishPartial(id.task, sink, i);
    std::string gap = absl::StrCat(prefix, "[shoal: ", offset - s.received,
                                   " bytes of this task's ", kStreamNames[i], " were lost here]\n");
    lines += gap;
    pending_combined_ += gap;
    combined_bytes_ += gap.size();
    s.received = s.committed = offset;
    s.raw = std::max(s.raw, offset);
    changed_.insert(id);
  }
  // The raw file takes every byte at once; only what an earlier master already wrote there
  // (the partial line it held when it died, sent again) is left out of it.
  if (uint64_t end = s.received + data.size(); end > s.raw) {
    sink.pending[i].append(data.substr(data.size() - (end - s.raw)));
    s.raw = end;
    changed_.insert(id);
    changed_files_.insert(id.task);
  }
  sink.partial_attempt[i] = id.attempt;
  partial.append(data);
  s.received += data.size();
  std::string found;
  size_t start = 0;
  for (size_t nl; (nl = partial.find('\n', start)) != std::string::npos; start = nl + 1) {
    found += prefix;
    found.append(partial, start, nl - start + 1);
  }
  if (start > 0) {
    Consume(id, start);
    partial.erase(0, start);
  }
  if (partial.size() > kMaxLine) {
    found += prefix + partial + "\n";
    Consume(id, partial.size());
    partial.clear();
  }
  pending_combined_ += found;
  combined_bytes_ += found.size();
  return lines + found;
}

std::string TaskLogs::FinishPartial(const std::string& task, Sink& sink, int stream_index) {
  std::string& partial = sink.partial[stream_index];
  if (partial.empty()) return "";
  std::string line = absl::StrCat(task, " | ", partial, "\n");
  pending_combined_ += line;
  combined_bytes_ += line.size();
  Consume({task, sink.partial_attempt[stream_index], stream_index == 1}, partial.size());
  partial.clear();
  return line;
}

std::string TaskLogs::FinishTask(const std::string& task) {
  auto it = sinks_.find(task);
  if (it == sinks_.end()) return "";
  std::string lines;
  for (int i = 0; i < 2; ++i) lines += FinishPartial(task, it->second, i);
  return lines;
}

std::string TaskLogs::FlushedState() const {
  nlohmann::json streams = nlohmann::json::array();
  for (const auto& [id, s] : streams_) {
    streams.push_back(
        {id.task, id.attempt, kStreamNames[id.is_stderr ? 1 : 0], s.flushed, s.raw_flushed});
  }
  nlohmann::json files = nlohmann::json::array();
  for (const auto& [file, size] : flushed_files_) files.push_back({file, size});
  nlohmann::json record = {{"start", flushed_bytes_},
                           {"end", flushed_bytes_},
                           {"streams", streams},
                           {"files", files}};
  return record.dump() + "\n";
}

std::string TaskLogs::NextFlushRecord() const {
  nlohmann::json streams = nlohmann::json::array();
  for (const TaskStreamId& id : changed_) {
    const StreamState& s = streams_.at(id);
    streams.push_back(
        {id.task, id.attempt, kStreamNames[id.is_stderr ? 1 : 0], s.committed, s.raw});
  }
  nlohmann::json files = nlohmann::json::array();
  for (const std::string& task : changed_files_) {
    const Sink& sink = sinks_.at(task);
    if (sink.fd[0] < 0) continue;
    for (int i = 0; i < 2; ++i) {
      files.push_back({absl::StrCat(sink.dir_name, "/", kStreamNames[i]),
                       sink.size[i] + sink.pending[i].size()});
    }
  }
  nlohmann::json record = {{"start", flushed_bytes_},
                           {"end", combined_bytes_},
                           {"streams", streams},
                           {"files", files}};
  return record.dump() + "\n";
}

absl::Status TaskLogs::AppendPositions(const std::string& record) {
  const std::string path = job_dir_ + "/logs.positions";
  if (positions_bytes_ + record.size() <= kMaxPositionsBytes) {
    if (auto st = WriteAll(positions_fd_, record, path); !st.ok()) return st;
    positions_bytes_ += record.size();
    return absl::OkStatus();
  }
  // Rewritten (write a sibling, rename; a reader finds the old file or the new one) as the
  // state the last flush left, then this flush's record: a master killed inside this flush
  // still finds where every stream was before it.
  std::string whole = FlushedState() + record;
  if (auto st = ReplaceFile(path, whole); !st.ok()) return st;
  int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("open " + path, errno);
  ::close(positions_fd_);
  positions_fd_ = fd;
  positions_bytes_ = whole.size();
  return absl::OkStatus();
}

bool TaskLogs::Flush() {
  if (pending_combined_.empty() && changed_.empty() && changed_files_.empty()) return true;
  // The order is what recovery relies on: the record, then the raw files, then logs.txt,
  // whose end tells whether the flush completed.
  absl::Status st = AppendPositions(NextFlushRecord());
  for (const std::string& task : changed_files_) {
    Sink& sink = sinks_.at(task);
    for (int i = 0; i < 2; ++i) {
      if (sink.fd[i] < 0) {  // no directory: no raw files
        sink.pending[i].clear();
        continue;
      }
      const std::string file = absl::StrCat(sink.dir_name, "/", kStreamNames[i]);
      if (st.ok() && !sink.pending[i].empty()) {
        st = WriteAll(sink.fd[i], sink.pending[i], file);
        sink.size[i] = SizeOf(sink.fd[i]);
      }
      sink.pending[i].clear();
      flushed_files_[file] = sink.size[i];
    }
  }
  if (st.ok()) st = WriteAll(combined_fd_, pending_combined_, job_dir_ + "/logs.txt");
  pending_combined_.clear();
  changed_files_.clear();
  if (!st.ok()) {
    // A full disk: this batch's output is lost, and the agents are not told it arrived. The
    // record already written claims more than logs.txt holds, so a master that opens the job
    // next cuts back to whole lines (Recover).
    static bool said = false;
    if (!std::exchange(said, true)) spdlog::error("task output is being lost: {}", st.ToString());
    flushed_bytes_ = combined_bytes_ = SizeOf(combined_fd_);
    changed_.clear();
    return false;
  }
  flushed_bytes_ = combined_bytes_;
  for (const TaskStreamId& id : changed_) {
    StreamState& s = streams_.at(id);
    if (s.committed != s.flushed) unreported_.insert(id);  // not for raw bytes alone
    s.flushed = s.committed;
    s.raw_flushed = s.raw;
  }
  changed_.clear();
  return true;
}

std::vector<CommittedOutput> TaskLogs::TakeCommitted() {
  std::vector<CommittedOutput> out;
  out.reserve(unreported_.size());
  for (const TaskStreamId& id : unreported_) {
    const StreamState& s = streams_.at(id);
    if (!s.source.empty()) out.push_back({id, s.flushed, s.source});
  }
  unreported_.clear();
  return out;
}

}  // namespace shoal::master
