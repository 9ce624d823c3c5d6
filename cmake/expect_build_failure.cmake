# Runs `cmake --build BUILD_DIR --target TARGET` and succeeds only if the build fails with output matching EXPECT.
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
    message(FATAL_ERROR "${TARGET} compiled, but it must be rejected at compile time")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT}")
    message(FATAL_ERROR "${TARGET} failed to compile, but without the expected diagnostic '${EXPECT}':\n${out}${err}")
endif()
message(STATUS "${TARGET} rejected at compile time as expected ('${EXPECT}')")
