# Writes OUT (a header defining SPECULA_GIT_REVISION) from the git revision of SOURCE_DIR, only
# when it changed, so a build recompiles the one file that includes it only after a commit.
# OVERRIDE, when not empty, is the revision (SPECULA_GIT_REVISION: a container build, whose
# context has no .git, passes it); otherwise "unknown" outside a git checkout.
if(DEFINED OVERRIDE AND NOT OVERRIDE STREQUAL "")
  set(revision "${OVERRIDE}")
else()
  execute_process(COMMAND git -C "${SOURCE_DIR}" rev-parse --short=12 HEAD
                  OUTPUT_VARIABLE revision OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
                  RESULT_VARIABLE failed)
  if(failed OR revision STREQUAL "")
    set(revision "unknown")
  else()
    execute_process(COMMAND git -C "${SOURCE_DIR}" status --porcelain --untracked-files=no
                    OUTPUT_VARIABLE changes ERROR_QUIET)
    if(NOT changes STREQUAL "")
      string(APPEND revision "-dirty")
    endif()
  endif()
endif()
set(text "#define SPECULA_GIT_REVISION \"${revision}\"\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
