# Build-fails test driver (tests/failtest). SOURCE's first line "// expect: <regex>" names the diagnostic.
# Builds CONTROL (if given) in BUILD_DIR, which must succeed, then TARGET, which must fail with output matching
# the regex. So the test passes only if the file is rejected at compile time, for the announced reason, and
# the same file compiles once the defect is removed.
file(STRINGS ${SOURCE} expect REGEX "^// expect: " LIMIT_COUNT 1)
string(REGEX REPLACE "^// expect: " "" expect "${expect}")
if(expect STREQUAL "")
    message(FATAL_ERROR "${SOURCE}: the first line must be '// expect: <regex>'")
endif()
if(CONTROL)
    execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${CONTROL}
        RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
        message(FATAL_ERROR "control build ${CONTROL} (the defect removed) must compile, but failed:\n${out}${err}")
    endif()
    message(STATUS "${CONTROL} compiles (control)")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
    message(FATAL_ERROR "${TARGET} compiled, but it must be rejected at compile time")
endif()
if(NOT "${out}${err}" MATCHES "${expect}")
    message(FATAL_ERROR "${TARGET} failed to compile, but without the expected diagnostic '${expect}':\n${out}${err}")
endif()
message(STATUS "${TARGET} rejected at compile time as expected ('${expect}')")
