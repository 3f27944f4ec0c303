# specula_add_test(NAME name SOURCES ... LIBS ...)
# One GoogleTest executable, registered with CTest test by test, labelled `gtest` (the C++ suite
# the sanitizer stages run, tools/hardening.sh).
function(specula_add_test)
  cmake_parse_arguments(T "" "NAME" "SOURCES;LIBS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main GTest::gmock)
  target_include_directories(${T_NAME} PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_definitions(${T_NAME} PRIVATE
    SPECULA_SOURCE_DIR="${PROJECT_SOURCE_DIR}" SPECULA_BINARY_DIR="${PROJECT_BINARY_DIR}")
  gtest_discover_tests(${T_NAME} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600 LABELS gtest)
endfunction()
