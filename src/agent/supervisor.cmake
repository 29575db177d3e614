# The agent's process supervisor: launching, watching and limiting task processes.
# Included from src/agent/CMakeLists.txt.
add_library(shoal_supervisor STATIC
  ${CMAKE_CURRENT_LIST_DIR}/cgroup_fs.cc
  ${CMAKE_CURRENT_LIST_DIR}/exec_plan.cc
  ${CMAKE_CURRENT_LIST_DIR}/process_supervisor.cc
  ${CMAKE_CURRENT_LIST_DIR}/resource_limits.cc
  ${CMAKE_CURRENT_LIST_DIR}/task_cgroup.cc)
target_link_libraries(shoal_supervisor
  PUBLIC shoal_common absl::status absl::statusor absl::synchronization
  PRIVATE absl::strings)
