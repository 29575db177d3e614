include(GoogleTest)
# shoal_add_test(NAME <name> SOURCES <files...> DEPS <targets...>)
# One GoogleTest executable per test file; it links the module target, never its sources.
function(shoal_add_test)
  cmake_parse_arguments(T "" "NAME" "SOURCES;DEPS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  target_compile_definitions(${T_NAME} PRIVATE
    SHOAL_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    SHOAL_BINARY="$<TARGET_FILE:shoal>")
  gtest_discover_tests(${T_NAME} DISCOVERY_TIMEOUT 60)
endfunction()
