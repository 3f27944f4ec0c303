# specula_add_test(NAME name SOURCES ... LIBS ... [LABELS ...])
# One GoogleTest executable, registered with CTest test by test, labelled `gtest` (the C++ suite
# the sanitizer stages run, tools/hardening.sh) and LABELS: `cuda` (needs a GPU, skipped without
# one; tools/ctest_summary.py counts them), `e2e` (the server over gRPC/HTTP loopback).
function(specula_add_test)
  cmake_parse_arguments(T "" "NAME" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main GTest::gmock)
  target_include_directories(${T_NAME} PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_definitions(${T_NAME} PRIVATE
    SPECULA_SOURCE_DIR="${PROJECT_SOURCE_DIR}" SPECULA_BINARY_DIR="${PROJECT_BINARY_DIR}")
  gtest_discover_tests(${T_NAME} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600)
  # Labels are set by a script CTest includes after the discovered tests (it lists them in
  # ${T_NAME}_TESTS): gtest_discover_tests' PROPERTIES cannot carry a list of labels.
  list(PREPEND T_LABELS gtest)
  set(labels_script ${CMAKE_CURRENT_BINARY_DIR}/${T_NAME}_labels.cmake)
  file(WRITE ${labels_script}
       "foreach(test IN LISTS ${T_NAME}_TESTS)\n"
       "  set_tests_properties(\"\${test}\" PROPERTIES LABELS \"${T_LABELS}\")\n"
       "endforeach()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${labels_script})
endfunction()
